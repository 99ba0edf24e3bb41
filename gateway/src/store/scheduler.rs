//! The scheduler's tables: cron jobs and their run log, and per-agent heartbeat state with the
//! wake coalescer and pending wake events (migration 0006).
//!
//! Exactly one fire per due time, on one node or several: a fire is claimed by one transaction
//! that moves the job's `next_due_at` only if it still holds the due time the claimant read,
//! marks the job running and inserts the run record (unique per job and due time). A second
//! claimant (another node, or a second timer generation during a restart) updates no row. The
//! finish is fenced by the claim's `fire_seq`, so a fire whose claim recovery released cannot
//! clear a newer one.

use serde_json::Value;

use super::{on_pool, opt_text, text, Store, StoreRow};
use crate::api::error::GatewayError;
use crate::api::tenancy::Tenant;

/// The owner of jobs declared in the configuration file (reachable by admin only: token ids
/// cannot contain `:`).
pub const CONFIG_OWNER: &str = "cron:config";

/// What a run record says of a fire that never ended (its node stopped).
pub const STOPPED: &str = "the gateway stopped during the fire";

/// Pending wake events kept per agent (the oldest are dropped past it).
pub const MAX_EVENTS: i64 = 100;

/// One cron job.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobRow {
    pub job_id: String,
    pub owner: String,
    pub name: String,
    pub agent_id: String,
    pub message: String,
    pub kind: String,
    /// JSON of the schedule as given.
    pub schedule: String,
    pub anchor_at: i64,
    pub enabled: bool,
    /// JSON of the wake gate (configuration-file jobs only).
    pub wake_gate: Option<String>,
    pub next_due_at: Option<i64>,
    pub fire_seq: i64,
    pub running_since: Option<i64>,
    pub running_node: Option<String>,
    pub last_run_at: Option<i64>,
    pub last_status: Option<String>,
    pub last_error: Option<String>,
    pub seed_hash: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
}

fn job_row(r: &impl StoreRow) -> Result<JobRow, sqlx::Error> {
    Ok(JobRow {
        job_id: r.col("job_id")?,
        owner: r.col("owner")?,
        name: r.col("name")?,
        agent_id: r.col("agent_id")?,
        message: r.col("message")?,
        kind: r.col("kind")?,
        schedule: r.col("schedule")?,
        anchor_at: r.col("anchor_at")?,
        enabled: r.col::<i64>("enabled")? != 0,
        wake_gate: r.col("wake_gate")?,
        next_due_at: r.col("next_due_at")?,
        fire_seq: r.col("fire_seq")?,
        running_since: r.col("running_since")?,
        running_node: r.col("running_node")?,
        last_run_at: r.col("last_run_at")?,
        last_status: r.col("last_status")?,
        last_error: r.col("last_error")?,
        seed_hash: r.col("seed_hash")?,
        created_at: r.col("created_at")?,
        updated_at: r.col("updated_at")?,
    })
}

/// One fire in the run log.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FireRow {
    pub id: i64,
    pub job_id: String,
    pub owner: String,
    pub job_name: String,
    pub agent_id: String,
    pub due_at: i64,
    pub ts: i64,
    pub trigger: String,
    pub status: String,
    pub duration_ms: Option<i64>,
    pub summary: Option<String>,
    pub error: Option<String>,
    pub tool_calls: Option<i64>,
    pub est_turns_saved: Option<i64>,
    pub root_run_id: Option<String>,
    pub gate: Option<String>,
    pub node: String,
}

fn fire_row(r: &impl StoreRow) -> Result<FireRow, sqlx::Error> {
    Ok(FireRow {
        id: r.col("id")?,
        job_id: r.col("job_id")?,
        owner: r.col("owner")?,
        job_name: r.col("job_name")?,
        agent_id: r.col("agent_id")?,
        due_at: r.col("due_at")?,
        ts: r.col("ts")?,
        trigger: r.col("fire_trigger")?,
        status: r.col("status")?,
        duration_ms: r.col("duration_ms")?,
        summary: r.col("summary")?,
        error: r.col("error")?,
        tool_calls: r.col("tool_calls")?,
        est_turns_saved: r.col("est_turns_saved")?,
        root_run_id: r.col("root_run_id")?,
        gate: r.col("gate")?,
        node: r.col("node")?,
    })
}

/// How a claim names the due time it serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimKind {
    /// The schedule's due time `due` (read from the job), moved on to `next`.
    Scheduled { due: i64, next: Option<i64> },
    /// Out of schedule (cron.run): the request time is the due time; the schedule stays.
    Manual,
}

/// A won claim: the fencing token and the run record's id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claimed {
    pub fire_seq: i64,
    pub record: i64,
    pub due_at: i64,
}

/// The outcome of a fire, written by its finish.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FireOutcome {
    pub status: &'static str,
    pub duration_ms: i64,
    pub summary: Option<String>,
    pub error: Option<String>,
    pub tool_calls: Option<i64>,
    pub est_turns_saved: Option<i64>,
    pub root_run_id: Option<String>,
    pub gate: Option<String>,
}

/// One agent's heartbeat row.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BeatRow {
    pub agent_id: String,
    pub next_due_at: Option<i64>,
    pub wake_at: Option<i64>,
    pub wake_sources: Option<String>,
    pub bypass_backoff: bool,
    pub running_since: Option<i64>,
    pub running_node: Option<String>,
    pub tick_seq: i64,
    pub last_run_at: Option<i64>,
    pub consecutive_errors: i64,
    pub backoff_until: Option<i64>,
    pub last_alert_at: Option<i64>,
    pub last_error_kind: Option<String>,
    pub last_error: Option<String>,
}

impl BeatRow {
    /// When this row is next claimable (None: nothing queued or scheduled, or it runs now):
    /// the earlier of the queued wake and the scheduled tick, held back by an error backoff
    /// unless the queued wake is a trigger.
    pub fn due(&self) -> Option<i64> {
        if self.running_since.is_some() {
            return None;
        }
        let base = match (self.wake_at, self.next_due_at) {
            (Some(w), Some(n)) => w.min(n),
            (w, n) => w.or(n)?,
        };
        let bypass = self.bypass_backoff && self.wake_at.is_some();
        Some(match self.backoff_until {
            Some(b) if !bypass => base.max(b),
            _ => base,
        })
    }
}

fn beat_row(r: &impl StoreRow) -> Result<BeatRow, sqlx::Error> {
    Ok(BeatRow {
        agent_id: r.col("agent_id")?,
        next_due_at: r.col("next_due_at")?,
        wake_at: r.col("wake_at")?,
        wake_sources: r.col("wake_sources")?,
        bypass_backoff: r.col::<i64>("bypass_backoff")? != 0,
        running_since: r.col("running_since")?,
        running_node: r.col("running_node")?,
        tick_seq: r.col("tick_seq")?,
        last_run_at: r.col("last_run_at")?,
        consecutive_errors: r.col("consecutive_errors")?,
        backoff_until: r.col("backoff_until")?,
        last_alert_at: r.col("last_alert_at")?,
        last_error_kind: r.col("last_error_kind")?,
        last_error: r.col("last_error")?,
    })
}

/// A won heartbeat claim: the fencing token, the wake sources it serves and the pending events
/// it took (source, text), oldest first.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BeatClaim {
    pub tick_seq: i64,
    pub sources: Vec<String>,
    pub events: Vec<(String, String)>,
}

/// What a tick's finish writes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BeatFinish {
    pub consecutive_errors: i64,
    pub backoff_until: Option<i64>,
    pub last_alert_at: Option<i64>,
    pub last_error_kind: Option<String>,
    pub last_error: Option<String>,
    /// A permanent error stops scheduled ticks until the settings change.
    pub stop_schedule: bool,
}

fn is_unique_violation(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d) if d.is_unique_violation())
}

impl Store {
    // ------------------------------------------------------------------ cron jobs

    /// Stores a new job. A name its owner already uses is -32002; so is an owner at `max_jobs`.
    pub async fn cron_insert(&self, j: &JobRow, max_jobs: i64) -> Result<(), GatewayError> {
        let count: i64 = on_pool!(self.pool(), |p| {
            sqlx::query_scalar("SELECT COUNT(*) FROM cron_jobs WHERE owner = $1")
                .bind(&j.owner)
                .fetch_one(p)
                .await?
        });
        if count >= max_jobs {
            return Err(GatewayError::Conflict(format!(
                "Too many cron jobs: an owner may hold at most {max_jobs} (scheduler.maxJobsPerOwner)"
            )));
        }
        let done = on_pool!(self.pool(), |p| {
            sqlx::query(
                "INSERT INTO cron_jobs (job_id, owner, name, agent_id, message, kind, schedule, \
                 anchor_at, enabled, wake_gate, next_due_at, seed_hash, created_at, updated_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)",
            )
            .bind(&j.job_id)
            .bind(&j.owner)
            .bind(text(&j.name))
            .bind(&j.agent_id)
            .bind(text(&j.message))
            .bind(&j.kind)
            .bind(text(&j.schedule))
            .bind(j.anchor_at)
            .bind(i64::from(j.enabled))
            .bind(&j.wake_gate)
            .bind(j.next_due_at)
            .bind(&j.seed_hash)
            .bind(j.created_at)
            .bind(j.updated_at)
            .execute(p)
            .await
            .map(drop)
        });
        match done {
            Ok(()) => Ok(()),
            Err(e) if is_unique_violation(&e) => Err(GatewayError::Conflict(format!(
                "A cron job named {} exists already",
                j.name
            ))),
            Err(e) => Err(e.into()),
        }
    }

    /// Writes a job's settings, and its next due time when `replan` (a new schedule, or enabled
    /// again); never its fire state: a fire running keeps its claim and is finished by its own
    /// fencing token, and a due time a fire claimed meanwhile is not written back.
    pub async fn cron_save(&self, j: &JobRow, replan: bool) -> Result<(), GatewayError> {
        on_pool!(self.pool(), |p| sqlx::query(
            "UPDATE cron_jobs SET agent_id = $1, message = $2, kind = $3, schedule = $4, \
             anchor_at = CASE WHEN $12 = 1 THEN $5 ELSE anchor_at END, enabled = $6, \
             wake_gate = $7, next_due_at = CASE WHEN $12 = 1 THEN $8 ELSE next_due_at END, \
             seed_hash = $9, updated_at = $10 WHERE job_id = $11",
        )
        .bind(&j.agent_id)
        .bind(text(&j.message))
        .bind(&j.kind)
        .bind(text(&j.schedule))
        .bind(j.anchor_at)
        .bind(i64::from(j.enabled))
        .bind(&j.wake_gate)
        .bind(j.next_due_at)
        .bind(&j.seed_hash)
        .bind(j.updated_at)
        .bind(&j.job_id)
        .bind(i64::from(replan))
        .execute(p)
        .await
        .map(drop))?;
        Ok(())
    }

    /// Deletes a job; its run records stay.
    pub async fn cron_delete(&self, job_id: &str) -> Result<bool, GatewayError> {
        Ok(on_pool!(self.pool(), |p| sqlx::query(
            "DELETE FROM cron_jobs WHERE job_id = $1"
        )
        .bind(job_id)
        .execute(p)
        .await?
        .rows_affected())
            > 0)
    }

    /// The job `name` within `tenant`'s reach. A tenant reaches its own job of that name. An
    /// admin names a job by its id, or by a name: the admin's own job of that name, else the
    /// configuration file's, else the only one; several owners' jobs of that name are -32002.
    pub async fn cron_job(
        &self,
        tenant: &Tenant,
        admin_id: &str,
        name: &str,
    ) -> Result<Option<JobRow>, GatewayError> {
        let rows: Vec<JobRow> = on_pool!(self.pool(), |p| {
            let rows = sqlx::query(
                "SELECT * FROM cron_jobs WHERE (name = $1 OR job_id = $1) \
                 AND ($2 IS NULL OR owner = $2) ORDER BY owner LIMIT 100",
            )
            .bind(name)
            .bind(tenant.only())
            .fetch_all(p)
            .await?;
            rows.iter().map(job_row).collect::<Result<_, _>>()?
        });
        if let Some(by_id) = rows.iter().find(|j| j.job_id == name) {
            return Ok(Some(by_id.clone()));
        }
        let named: Vec<&JobRow> = rows.iter().filter(|j| j.name == name).collect();
        if named.len() <= 1 {
            return Ok(named.first().map(|j| (*j).clone()));
        }
        let pick = named
            .iter()
            .find(|j| j.owner == admin_id)
            .or_else(|| named.iter().find(|j| j.owner == CONFIG_OWNER));
        match pick {
            Some(j) => Ok(Some((*j).clone())),
            None => Err(GatewayError::Conflict(format!(
                "Several cron jobs are named {name}; use the job id"
            ))),
        }
    }

    /// The jobs `tenant` reaches, by owner then name.
    pub async fn cron_list(&self, tenant: &Tenant) -> Result<Vec<JobRow>, GatewayError> {
        Ok(on_pool!(self.pool(), |p| {
            let rows = sqlx::query(
                "SELECT * FROM cron_jobs WHERE ($1 IS NULL OR owner = $1) ORDER BY owner, name",
            )
            .bind(tenant.only())
            .fetch_all(p)
            .await?;
            rows.iter().map(job_row).collect::<Result<_, _>>()?
        }))
    }

    /// Every job the configuration file declared (owner `cron:config`).
    pub async fn cron_config_jobs(&self) -> Result<Vec<JobRow>, GatewayError> {
        Ok(on_pool!(self.pool(), |p| {
            let rows = sqlx::query("SELECT * FROM cron_jobs WHERE owner = $1 ORDER BY name")
                .bind(CONFIG_OWNER)
                .fetch_all(p)
                .await?;
            rows.iter().map(job_row).collect::<Result<_, _>>()?
        }))
    }

    /// The earliest due time of a job that can be claimed (enabled, not firing).
    pub async fn cron_earliest(&self) -> Result<Option<i64>, GatewayError> {
        Ok(on_pool!(self.pool(), |p| sqlx::query_scalar(
            "SELECT MIN(next_due_at) FROM cron_jobs WHERE enabled = 1 AND running_since IS NULL"
        )
        .fetch_one(p)
        .await?))
    }

    /// Claimable jobs due at `now`, earliest first; `owner` narrows to one owner's (cron.run due).
    pub async fn cron_due(
        &self,
        now: i64,
        owner: Option<&str>,
        limit: i64,
    ) -> Result<Vec<JobRow>, GatewayError> {
        Ok(on_pool!(self.pool(), |p| {
            let rows = sqlx::query(
                "SELECT * FROM cron_jobs WHERE enabled = 1 AND running_since IS NULL \
                 AND next_due_at <= $1 AND ($2 IS NULL OR owner = $2) \
                 ORDER BY next_due_at, job_id LIMIT $3",
            )
            .bind(now)
            .bind(owner)
            .bind(limit)
            .fetch_all(p)
            .await?;
            rows.iter().map(job_row).collect::<Result<_, _>>()?
        }))
    }

    /// Moves a due job on without firing it (the `skip` catch-up policy); false when another
    /// claimant moved it first.
    pub async fn cron_advance(
        &self,
        job_id: &str,
        due: i64,
        next: Option<i64>,
        now: i64,
    ) -> Result<bool, GatewayError> {
        Ok(on_pool!(self.pool(), |p| sqlx::query(
            "UPDATE cron_jobs SET next_due_at = $1, updated_at = $2, \
             enabled = CASE WHEN $1 IS NULL THEN 0 ELSE enabled END \
             WHERE job_id = $3 AND next_due_at = $4 AND running_since IS NULL"
        )
        .bind(next)
        .bind(now)
        .bind(job_id)
        .bind(due)
        .execute(p)
        .await?
        .rows_affected())
            > 0)
    }

    /// Claims one fire of `job` for this node: None when another claimant won (or the job is
    /// firing already).
    pub async fn cron_claim(
        &self,
        job: &JobRow,
        claim: ClaimKind,
        trigger: &str,
        now: i64,
    ) -> Result<Option<Claimed>, GatewayError> {
        let mut won = self.cron_claims(&[(job, claim, trigger)], now).await?;
        Ok(won.pop().flatten())
    }

    /// Claims fires for this node in one transaction (the fires due in one timer pass cost one
    /// commit): for each `(job, claim, trigger)`, the claim when it was won. A due time that
    /// already has a record (never expected) moves the job on without a fire.
    pub async fn cron_claims(
        &self,
        claims: &[(&JobRow, ClaimKind, &str)],
        now: i64,
    ) -> Result<Vec<Option<Claimed>>, GatewayError> {
        let node = self.node();
        let mut out = Vec::with_capacity(claims.len());
        on_pool!(self.pool(), |p| {
            let mut tx = p.begin().await?;
            for (job, claim, trigger) in claims {
                let seq: Option<i64> = match *claim {
                    ClaimKind::Scheduled { due, next } => {
                        sqlx::query_scalar(
                            "UPDATE cron_jobs SET next_due_at = $1, fire_seq = fire_seq + 1, \
                             running_since = $2, running_node = $3, last_run_at = $2, \
                             updated_at = $2, enabled = CASE WHEN $1 IS NULL THEN 0 ELSE enabled END \
                             WHERE job_id = $4 AND next_due_at = $5 AND enabled = 1 \
                             AND running_since IS NULL RETURNING fire_seq",
                        )
                        .bind(next)
                        .bind(now)
                        .bind(node)
                        .bind(&job.job_id)
                        .bind(due)
                        .fetch_optional(&mut *tx)
                        .await?
                    }
                    ClaimKind::Manual => {
                        sqlx::query_scalar(
                            "UPDATE cron_jobs SET fire_seq = fire_seq + 1, running_since = $1, \
                             running_node = $2, last_run_at = $1, updated_at = $1 \
                             WHERE job_id = $3 AND running_since IS NULL RETURNING fire_seq",
                        )
                        .bind(now)
                        .bind(node)
                        .bind(&job.job_id)
                        .fetch_optional(&mut *tx)
                        .await?
                    }
                };
                let Some(fire_seq) = seq else {
                    out.push(None);
                    continue;
                };
                let due_at = match *claim {
                    ClaimKind::Scheduled { due, .. } => due,
                    ClaimKind::Manual => now,
                };
                let record: Option<i64> = sqlx::query_scalar(
                    "INSERT INTO cron_runs (job_id, owner, job_name, agent_id, due_at, ts, \
                     fire_trigger, status, node) VALUES ($1, $2, $3, $4, $5, $6, $7, 'running', $8) \
                     ON CONFLICT (job_id, due_at) DO NOTHING RETURNING id",
                )
                .bind(&job.job_id)
                .bind(&job.owner)
                .bind(text(&job.name))
                .bind(&job.agent_id)
                .bind(due_at)
                .bind(now)
                .bind(*trigger)
                .bind(node)
                .fetch_optional(&mut *tx)
                .await?;
                match record {
                    Some(record) => out.push(Some(Claimed {
                        fire_seq,
                        record,
                        due_at,
                    })),
                    None => {
                        // This due time has a record already: never a second fire of it.
                        sqlx::query(
                            "UPDATE cron_jobs SET running_since = NULL, running_node = NULL \
                             WHERE job_id = $1 AND fire_seq = $2",
                        )
                        .bind(&job.job_id)
                        .bind(fire_seq)
                        .execute(&mut *tx)
                        .await?;
                        out.push(None);
                    }
                }
            }
            tx.commit().await?;
        });
        Ok(out)
    }

    /// Records a fire's outcome and releases the job (when the claim is still this fire's).
    pub async fn cron_finish(
        &self,
        job_id: &str,
        claimed: Claimed,
        o: &FireOutcome,
        keep_per_job: i64,
    ) -> Result<(), GatewayError> {
        on_pool!(self.pool(), |p| {
            let mut tx = p.begin().await?;
            sqlx::query(
                "UPDATE cron_runs SET status = $1, duration_ms = $2, summary = $3, error = $4, \
                 tool_calls = $5, est_turns_saved = $6, root_run_id = $7, gate = $8 WHERE id = $9",
            )
            .bind(o.status)
            .bind(o.duration_ms)
            .bind(opt_text(&o.summary))
            .bind(opt_text(&o.error))
            .bind(o.tool_calls)
            .bind(o.est_turns_saved)
            .bind(&o.root_run_id)
            .bind(&o.gate)
            .bind(claimed.record)
            .execute(&mut *tx)
            .await?;
            sqlx::query(
                "UPDATE cron_jobs SET running_since = NULL, running_node = NULL, last_status = $1, \
                 last_error = $2 WHERE job_id = $3 AND fire_seq = $4",
            )
            .bind(o.status)
            .bind(opt_text(&o.error))
            .bind(job_id)
            .bind(claimed.fire_seq)
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            // Retention: the newest `keep_per_job` finished records of the job.
            sqlx::query(
                "DELETE FROM cron_runs WHERE job_id = $1 AND status <> 'running' AND id <= \
                 (SELECT id FROM cron_runs WHERE job_id = $1 ORDER BY id DESC LIMIT 1 OFFSET $2)",
            )
            .bind(job_id)
            .bind(keep_per_job)
            .execute(p)
            .await
            .map(drop)
        })?;
        Ok(())
    }

    /// Finished fires of the jobs named `name` that `tenant` reaches, newest first.
    pub async fn cron_runs(
        &self,
        tenant: &Tenant,
        name: &str,
        agent_id: Option<&str>,
        limit: i64,
    ) -> Result<Vec<FireRow>, GatewayError> {
        Ok(on_pool!(self.pool(), |p| {
            let rows = sqlx::query(
                "SELECT * FROM cron_runs WHERE (job_name = $1 OR job_id = $1) \
                 AND ($2 IS NULL OR owner = $2) AND status <> 'running' \
                 AND ($3 IS NULL OR agent_id = $3) ORDER BY ts DESC, id DESC LIMIT $4",
            )
            .bind(name)
            .bind(tenant.only())
            .bind(agent_id)
            .bind(limit)
            .fetch_all(p)
            .await?;
            rows.iter().map(fire_row).collect::<Result<_, _>>()?
        }))
    }

    /// Every run record of one job, oldest first.
    #[cfg(test)]
    pub async fn cron_fires_of(&self, job_id: &str) -> Result<Vec<FireRow>, GatewayError> {
        Ok(on_pool!(self.pool(), |p| {
            let rows = sqlx::query("SELECT * FROM cron_runs WHERE job_id = $1 ORDER BY id")
                .bind(job_id)
                .fetch_all(p)
                .await?;
            rows.iter().map(fire_row).collect::<Result<_, _>>()?
        }))
    }

    /// Deletes finished run records older than `before`; the count removed.
    pub async fn cron_prune(&self, before: i64) -> Result<u64, GatewayError> {
        Ok(on_pool!(self.pool(), |p| sqlx::query(
            "DELETE FROM cron_runs WHERE ts < $1 AND status <> 'running'"
        )
        .bind(before)
        .execute(p)
        .await?
        .rows_affected()))
    }

    /// Releases the fires and ticks whose node is gone (`live_since`: nodes seen after it are
    /// alive; None: only this node is): their jobs can fire again, and their run records end as
    /// `error` (never re-run: the turn may have run tools). The count of fires released.
    pub async fn scheduler_release_dead(
        &self,
        now: i64,
        live_since: Option<i64>,
    ) -> Result<u64, GatewayError> {
        let cond = |col: &str| super::runs::unheld_by(col, 1, 2);
        let jobs = format!(
            "UPDATE cron_jobs SET running_since = NULL, running_node = NULL, last_status = 'error', \
             last_error = '{STOPPED}' WHERE running_since IS NOT NULL AND {}",
            cond("running_node")
        );
        let runs = format!(
            "UPDATE cron_runs SET status = 'error', error = '{STOPPED}', duration_ms = $3 - ts \
             WHERE status = 'running' AND {}",
            cond("node")
        );
        let beats = format!(
            "UPDATE heartbeat_state SET running_since = NULL, running_node = NULL \
             WHERE running_since IS NOT NULL AND {}",
            cond("running_node")
        );
        let node = self.node();
        Ok(on_pool!(self.pool(), |p| {
            let mut tx = p.begin().await?;
            let released = sqlx::query(&jobs)
                .bind(node)
                .bind(live_since)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            sqlx::query(&runs)
                .bind(node)
                .bind(live_since)
                .bind(now)
                .execute(&mut *tx)
                .await?;
            sqlx::query(&beats)
                .bind(node)
                .bind(live_since)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            released
        }))
    }

    // ------------------------------------------------------------------ heartbeats

    /// Every agent's heartbeat row.
    pub async fn beats(&self) -> Result<Vec<BeatRow>, GatewayError> {
        Ok(on_pool!(self.pool(), |p| {
            let rows = sqlx::query("SELECT * FROM heartbeat_state ORDER BY agent_id")
                .fetch_all(p)
                .await?;
            rows.iter().map(beat_row).collect::<Result<_, _>>()?
        }))
    }

    /// One agent's heartbeat row.
    pub async fn beat(&self, agent_id: &str) -> Result<Option<BeatRow>, GatewayError> {
        Ok(on_pool!(self.pool(), |p| {
            let row = sqlx::query("SELECT * FROM heartbeat_state WHERE agent_id = $1")
                .bind(agent_id)
                .fetch_optional(p)
                .await?;
            row.as_ref().map(beat_row).transpose()?
        }))
    }

    /// Sets an agent's next scheduled tick (None: none). `clear_errors` ends a permanent stop
    /// and the backoff (the settings changed).
    pub async fn beat_schedule(
        &self,
        agent_id: &str,
        next: Option<i64>,
        clear_errors: bool,
        now: i64,
    ) -> Result<(), GatewayError> {
        on_pool!(self.pool(), |p| {
            sqlx::query(
                "INSERT INTO heartbeat_state (agent_id, next_due_at, updated_at) VALUES ($1, $2, $3) \
                 ON CONFLICT (agent_id) DO UPDATE SET next_due_at = $2, updated_at = $3, \
                 backoff_until = CASE WHEN $4 = 1 THEN NULL ELSE heartbeat_state.backoff_until END, \
                 last_error_kind = CASE WHEN $4 = 1 THEN NULL ELSE heartbeat_state.last_error_kind END",
            )
            .bind(agent_id)
            .bind(next)
            .bind(now)
            .bind(i64::from(clear_errors))
            .execute(p)
            .await
            .map(drop)
        })?;
        Ok(())
    }

    /// Queues a pending event for the agent's next tick (webhook `next-heartbeat`), keeping the
    /// newest [`MAX_EVENTS`].
    pub async fn beat_event(
        &self,
        agent_id: &str,
        source: &str,
        event: &str,
        now: i64,
    ) -> Result<(), GatewayError> {
        on_pool!(self.pool(), |p| {
            let mut tx = p.begin().await?;
            sqlx::query(
                "INSERT INTO heartbeat_events (agent_id, source, text, created_at) \
                 VALUES ($1, $2, $3, $4)",
            )
            .bind(agent_id)
            .bind(text(source))
            .bind(text(event))
            .bind(now)
            .execute(&mut *tx)
            .await?;
            sqlx::query(
                "DELETE FROM heartbeat_events WHERE agent_id = $1 AND id < \
                 (SELECT id FROM heartbeat_events WHERE agent_id = $1 ORDER BY id DESC \
                 LIMIT 1 OFFSET $2)",
            )
            .bind(agent_id)
            .bind(MAX_EVENTS - 1)
            .execute(&mut *tx)
            .await?;
            tx.commit().await
        })?;
        Ok(())
    }

    /// The coalescer: queues one tick of the agent unless one is queued already (true: this
    /// call queued it). `bypass_backoff` marks a heartbeat.trigger.
    pub async fn beat_wake(
        &self,
        agent_id: &str,
        source: &str,
        bypass_backoff: bool,
        now: i64,
    ) -> Result<bool, GatewayError> {
        let sources = Value::from(vec![Value::from(source)]).to_string();
        Ok(on_pool!(self.pool(), |p| {
            let mut tx = p.begin().await?;
            sqlx::query(
                "INSERT INTO heartbeat_state (agent_id, updated_at) VALUES ($1, $2) \
                 ON CONFLICT (agent_id) DO NOTHING",
            )
            .bind(agent_id)
            .bind(now)
            .execute(&mut *tx)
            .await?;
            let queued = sqlx::query(
                "UPDATE heartbeat_state SET wake_at = $1, wake_sources = $2, bypass_backoff = $3, \
                 updated_at = $1 WHERE agent_id = $4 AND wake_at IS NULL",
            )
            .bind(now)
            .bind(text(&sources))
            .bind(i64::from(bypass_backoff))
            .bind(agent_id)
            .execute(&mut *tx)
            .await?
            .rows_affected()
                > 0;
            if !queued && bypass_backoff {
                // A trigger folded into a queued wake lets that wake run now.
                sqlx::query("UPDATE heartbeat_state SET bypass_backoff = 1 WHERE agent_id = $1")
                    .bind(agent_id)
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await?;
            queued
        }))
    }

    /// Claims a tick of the agent for this node, as read in `seen` (None when another claimant
    /// won or the row changed): moves the scheduled tick to `next` when it was due, takes the
    /// queued wake and every pending event.
    pub async fn beat_claim(
        &self,
        seen: &BeatRow,
        next: Option<i64>,
        now: i64,
    ) -> Result<Option<BeatClaim>, GatewayError> {
        let node = self.node();
        Ok(on_pool!(self.pool(), |p| {
            let mut tx = p.begin().await?;
            let won: Option<(i64, Option<String>)> = sqlx::query_as(
                "UPDATE heartbeat_state SET running_since = $1, running_node = $2, \
                 tick_seq = tick_seq + 1, wake_at = NULL, bypass_backoff = 0, \
                 next_due_at = $3, updated_at = $1 \
                 WHERE agent_id = $4 AND running_since IS NULL AND tick_seq = $5 \
                 AND (next_due_at = $6 OR (next_due_at IS NULL AND $6 IS NULL)) \
                 RETURNING tick_seq, wake_sources",
            )
            .bind(now)
            .bind(node)
            .bind(next)
            .bind(&seen.agent_id)
            .bind(seen.tick_seq)
            .bind(seen.next_due_at)
            .fetch_optional(&mut *tx)
            .await?;
            let Some((tick_seq, sources)) = won else {
                return Ok(None);
            };
            // RETURNING gives the values after the update: the sources are cleared second.
            sqlx::query("UPDATE heartbeat_state SET wake_sources = NULL WHERE agent_id = $1")
                .bind(&seen.agent_id)
                .execute(&mut *tx)
                .await?;
            let events: Vec<(i64, String, String)> = sqlx::query_as(
                "SELECT id, source, text FROM heartbeat_events WHERE agent_id = $1 ORDER BY id",
            )
            .bind(&seen.agent_id)
            .fetch_all(&mut *tx)
            .await?;
            if let Some((last, ..)) = events.last() {
                sqlx::query("DELETE FROM heartbeat_events WHERE agent_id = $1 AND id <= $2")
                    .bind(&seen.agent_id)
                    .bind(last)
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await?;
            let sources = sources
                .and_then(|s| serde_json::from_str::<Vec<String>>(&s).ok())
                .unwrap_or_default();
            Ok::<_, sqlx::Error>(Some(BeatClaim {
                tick_seq,
                sources,
                events: events.into_iter().map(|(_, s, t)| (s, t)).collect(),
            }))
        }?))
    }

    /// Ends a tick (when its claim is still this tick's).
    pub async fn beat_finish(
        &self,
        agent_id: &str,
        tick_seq: i64,
        f: &BeatFinish,
        now: i64,
    ) -> Result<(), GatewayError> {
        on_pool!(self.pool(), |p| {
            sqlx::query(
            "UPDATE heartbeat_state SET running_since = NULL, running_node = NULL, last_run_at = $1, \
             consecutive_errors = $2, backoff_until = $3, last_alert_at = $4, last_error_kind = $5, \
             last_error = $6, updated_at = $1, \
             next_due_at = CASE WHEN $7 = 1 THEN NULL ELSE next_due_at END \
             WHERE agent_id = $8 AND tick_seq = $9",
        )
        .bind(now)
        .bind(f.consecutive_errors)
        .bind(f.backoff_until)
        .bind(f.last_alert_at)
        .bind(&f.last_error_kind)
        .bind(opt_text(&f.last_error))
        .bind(i64::from(f.stop_schedule))
        .bind(agent_id)
        .bind(tick_seq)
        .execute(p)
        .await
        .map(drop)
        })?;
        Ok(())
    }
}
