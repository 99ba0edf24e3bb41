//! The `runs` table: runs started in the background (session.spawn, session.send async) and
//! their outcome, readable with session.run_status after the run and across restarts.

use super::{on_pool, opt_text, text, Store, StoreRow};
use crate::api::error::GatewayError;
use crate::api::tenancy::Tenant;

/// One run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunRow {
    pub run_id: String,
    pub root_run_id: String,
    pub parent_run_id: Option<String>,
    pub agent_id: String,
    pub session_key: String,
    pub task: String,
    pub status: String,
    pub depth: i64,
    pub client_id: String,
    pub started_at: i64,
    pub completed_at: Option<i64>,
    pub response: Option<String>,
    pub input_tokens: Option<i64>,
    pub output_tokens: Option<i64>,
    pub cost_usd: Option<f64>,
    pub finish_reason: Option<String>,
    pub error: Option<String>,
    /// Where the answer goes (JSON `{deliver, channel, to}`), for runs started by webhooks.
    pub delivery: Option<String>,
}

fn run_row(r: &impl StoreRow) -> Result<RunRow, sqlx::Error> {
    Ok(RunRow {
        run_id: r.col("run_id")?,
        root_run_id: r.col("root_run_id")?,
        parent_run_id: r.col("parent_run_id")?,
        agent_id: r.col("agent_id")?,
        session_key: r.col("session_key")?,
        task: r.col("task")?,
        status: r.col("status")?,
        depth: r.col("depth")?,
        client_id: r.col("client_id")?,
        started_at: r.col("started_at")?,
        completed_at: r.col("completed_at")?,
        response: r.col("response")?,
        input_tokens: r.col("input_tokens")?,
        output_tokens: r.col("output_tokens")?,
        cost_usd: r.col("cost_usd")?,
        finish_reason: r.col("finish_reason")?,
        error: r.col("error")?,
        delivery: r.col("delivery")?,
    })
}

/// The condition "the run's holder is not alive": nobody holds it, or its holder is neither
/// `$me` nor, when `$since` is set, a node seen after `$since` (several nodes on PostgreSQL).
/// With `$since` NULL only `$me` counts as alive (one process on SQLite).
fn unheld(me: u8, since: u8) -> String {
    unheld_by("claimed_by", me, since)
}

/// [`unheld`] of the holder in column `col` (the scheduler's fire and tick claims).
pub(super) fn unheld_by(col: &str, me: u8, since: u8) -> String {
    format!(
        "({col} IS NULL OR ({col} <> ${me} AND (${since} IS NULL OR {col} NOT IN \
         (SELECT node_id FROM nodes WHERE seen_at > ${since}))))"
    )
}

/// What a run whose holder stopped says (graph runs too, through `end_unheld`).
const ORPHANED: &str = "the gateway stopped before the run ended";

impl Store {
    /// Records a run this node starts (it holds the run until it ends).
    pub async fn run_insert(&self, r: &RunRow) -> Result<(), GatewayError> {
        on_pool!(self.pool(), |p| {
            sqlx::query(
            "INSERT INTO runs (run_id, root_run_id, parent_run_id, agent_id, session_key, task, status, \
             depth, client_id, started_at, delivery, claimed_by) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
        )
        .bind(&r.run_id)
        .bind(&r.root_run_id)
        .bind(&r.parent_run_id)
        .bind(&r.agent_id)
        .bind(&r.session_key)
        .bind(text(&r.task))
        .bind(&r.status)
        .bind(r.depth)
        .bind(&r.client_id)
        .bind(r.started_at)
        .bind(&r.delivery)
        .bind(self.node())
        .execute(p)
        .await
        .map(drop)
        })?;
        Ok(())
    }

    /// Records the end of a run.
    pub async fn run_finish(&self, r: &RunRow) -> Result<(), GatewayError> {
        on_pool!(self.pool(), |p| sqlx::query(
            "UPDATE runs SET status = $1, completed_at = $2, response = $3, input_tokens = $4, \
             output_tokens = $5, cost_usd = $6, finish_reason = $7, error = $8 WHERE run_id = $9",
        )
        .bind(&r.status)
        .bind(r.completed_at)
        .bind(opt_text(&r.response))
        .bind(r.input_tokens)
        .bind(r.output_tokens)
        .bind(r.cost_usd)
        .bind(&r.finish_reason)
        .bind(opt_text(&r.error))
        .bind(&r.run_id)
        .execute(p)
        .await
        .map(drop))?;
        Ok(())
    }

    /// The run `run_id` when `tenant` reaches it (its starting client's, or admin).
    pub async fn run_get(
        &self,
        tenant: &Tenant,
        run_id: &str,
    ) -> Result<Option<RunRow>, GatewayError> {
        Ok(on_pool!(self.pool(), |p| {
            let row = sqlx::query(
                "SELECT * FROM runs WHERE run_id = $1 AND ($2 IS NULL OR client_id = $2)",
            )
            .bind(run_id)
            .bind(tenant.only())
            .fetch_optional(p)
            .await?;
            row.as_ref().map(run_row).transpose()?
        }))
    }
}

/// A queued run that can be started again after a restart: its row and the JSON of what it
/// needs besides (see `runs.resume`).
#[derive(Debug, Clone, PartialEq)]
pub struct ResumableRun {
    pub row: RunRow,
    pub resume: String,
}

/// Whether a webhook delivery was new.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// Not seen within its window: recorded now.
    First,
    /// Seen and not expired: a replay.
    Repeat,
}

impl Store {
    /// Inserts a queued run with what it needs to be resumed, held by this node. Committed
    /// before it returns, so an acknowledgement sent after it survives a killed process.
    pub async fn run_insert_queued(&self, r: &RunRow, resume: &str) -> Result<(), GatewayError> {
        on_pool!(self.pool(), |p| {
            sqlx::query(
            "INSERT INTO runs (run_id, root_run_id, parent_run_id, agent_id, session_key, task, status, \
             depth, client_id, started_at, delivery, resume, claimed_by) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)",
        )
        .bind(&r.run_id)
        .bind(&r.root_run_id)
        .bind(&r.parent_run_id)
        .bind(&r.agent_id)
        .bind(&r.session_key)
        .bind(text(&r.task))
        .bind(&r.status)
        .bind(r.depth)
        .bind(&r.client_id)
        .bind(r.started_at)
        .bind(&r.delivery)
        .bind(resume)
        .bind(self.node())
        .execute(p)
        .await
        .map(drop)
        })?;
        Ok(())
    }

    /// A queued run starts on this node: `running` from `now`. False when it is no longer
    /// queued (a kill or a revocation ended it while it waited): it must not start.
    pub async fn run_mark_running(&self, run_id: &str, now: i64) -> Result<bool, GatewayError> {
        let changed = on_pool!(self.pool(), |p| {
            sqlx::query(
                "UPDATE runs SET status = 'running', started_at = $1, claimed_by = $2 \
                 WHERE run_id = $3 AND status = 'queued' AND completed_at IS NULL",
            )
            .bind(now)
            .bind(self.node())
            .bind(run_id)
            .execute(p)
            .await
            .map(|r| r.rows_affected())
        })?;
        Ok(changed > 0)
    }

    /// Ends the runs of `scope` that are still queued (acknowledged, not started, on any node
    /// or none) with final status `status` (`killed` or `revoked`), so that neither the task
    /// waiting for their slot nor a later restart starts them. Answers the runs ended.
    pub async fn runs_end_queued(
        &self,
        scope: StopScope<'_>,
        status: &str,
    ) -> Result<Vec<String>, GatewayError> {
        let (cond, id) = scope_condition(scope);
        let end = format!(
            "{SUBTREE}UPDATE runs AS r SET status = $2, stop_requested = $2, completed_at = $3, \
             error = 'stopped before it started' \
             WHERE {cond} AND r.status = 'queued' AND r.completed_at IS NULL RETURNING run_id"
        );
        Ok(on_pool!(self.pool(), |p| {
            sqlx::query_scalar(&end)
                .bind(id)
                .bind(status)
                .bind(crate::clock::now_ms())
                .fetch_all(p)
                .await?
        }))
    }

    /// Takes over, for this node, the resumable queued runs no live node holds, oldest first.
    /// `live_since`: nodes seen after it are alive (None: only this node is). Each run is
    /// taken once: the conditional update lets one claimant win, whichever node it runs on.
    pub async fn runs_claim_queued(
        &self,
        live_since: Option<i64>,
    ) -> Result<Vec<ResumableRun>, GatewayError> {
        let sql = format!(
            "UPDATE runs SET claimed_by = $1 WHERE status = 'queued' AND resume IS NOT NULL AND {} \
             RETURNING *",
            unheld(1, 2)
        );
        let mut out: Vec<ResumableRun> = on_pool!(self.pool(), |p| {
            let rows = sqlx::query(&sql)
                .bind(self.node())
                .bind(live_since)
                .fetch_all(p)
                .await?;
            let mut out = Vec::with_capacity(rows.len());
            for r in &rows {
                out.push(ResumableRun {
                    row: run_row(r)?,
                    resume: r.col("resume")?,
                });
            }
            out
        });
        out.sort_by(|a, b| {
            (a.row.started_at, &a.row.run_id).cmp(&(b.row.started_at, &b.row.run_id))
        });
        Ok(out)
    }

    /// Runs whose holder is gone become orphaned (a run cannot continue without the process
    /// that ran it), except queued runs that can be resumed: those stay queued for
    /// [`Store::runs_claim_queued`]. `live_since` as there.
    pub async fn runs_orphan_unresumable(
        &self,
        now: i64,
        live_since: Option<i64>,
    ) -> Result<u64, GatewayError> {
        let sql = format!(
            "UPDATE runs SET status = 'orphaned', completed_at = $3, error = $4 \
             WHERE (status = 'running' OR (status = 'queued' AND resume IS NULL)) AND {}",
            unheld(1, 2)
        );
        self.end_unheld(&sql, now, live_since).await
    }

    /// Runs `sql`, an UPDATE ending the rows of dead holders, binding this node ($1),
    /// `live_since` ($2), `now` ($3) and the [`ORPHANED`] error ($4); answers the rows ended.
    pub(super) async fn end_unheld(
        &self,
        sql: &str,
        now: i64,
        live_since: Option<i64>,
    ) -> Result<u64, GatewayError> {
        Ok(on_pool!(self.pool(), |p| sqlx::query(sql)
            .bind(self.node())
            .bind(live_since)
            .bind(now)
            .bind(ORPHANED)
            .execute(p)
            .await?
            .rows_affected()))
    }

    /// Records a signed webhook delivery unless it was seen and has not expired; expired
    /// entries are swept on the way, and past `capacity` entries the soonest to expire go.
    /// Across nodes the insert decides: of two nodes recording one delivery at once, one
    /// inserts and the other finds it (after the first commits) and answers `Repeat`.
    pub async fn webhook_delivery_seen(
        &self,
        delivery: &str,
        now: i64,
        expires_at: i64,
        capacity: i64,
    ) -> Result<Delivery, GatewayError> {
        let inserted = on_pool!(self.pool(), |p| {
            let mut tx = p.begin().await?;
            sqlx::query("DELETE FROM webhook_deliveries WHERE expires_at <= $1")
                .bind(now)
                .execute(&mut *tx)
                .await?;
            let n = sqlx::query(
                "INSERT INTO webhook_deliveries (delivery, expires_at) VALUES ($1, $2) \
                 ON CONFLICT (delivery) DO NOTHING",
            )
            .bind(delivery)
            .bind(expires_at)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            tx.commit().await?;
            n
        });
        if inserted == 0 {
            return Ok(Delivery::Repeat);
        }
        // Bounded: beyond capacity, forget the entries closest to expiring (never this one).
        // After the commit, so two nodes' deliveries never wait on each other's prune.
        on_pool!(self.pool(), |p| {
            sqlx::query(
            "DELETE FROM webhook_deliveries WHERE delivery IN (SELECT delivery FROM webhook_deliveries \
             WHERE delivery <> $1 ORDER BY expires_at LIMIT (SELECT CASE WHEN COUNT(*) > $2 \
             THEN COUNT(*) - $2 ELSE 0 END FROM webhook_deliveries))",
        )
        .bind(delivery)
        .bind(capacity.max(1))
        .execute(p)
        .await
        .map(drop)
        })?;
        Ok(Delivery::First)
    }

    /// Forgets a delivery (its run could not be queued: a redelivery must run).
    pub async fn webhook_delivery_forget(&self, delivery: &str) -> Result<(), GatewayError> {
        on_pool!(self.pool(), |p| sqlx::query(
            "DELETE FROM webhook_deliveries WHERE delivery = $1"
        )
        .bind(delivery)
        .execute(p)
        .await
        .map(drop))?;
        Ok(())
    }

    /// How many deliveries are remembered (tests, diagnostics).
    pub async fn webhook_deliveries_count(&self) -> Result<i64, GatewayError> {
        Ok(on_pool!(self.pool(), |p| sqlx::query_scalar::<_, i64>(
            "SELECT COUNT(*) FROM webhook_deliveries"
        )
        .fetch_one(p)
        .await?))
    }
}

#[cfg(test)]
mod durability_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    async fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("t.db")).await.unwrap();
        (dir, store)
    }

    fn queued(id: &str, at: i64) -> RunRow {
        RunRow {
            run_id: id.into(),
            root_run_id: id.into(),
            agent_id: "a".into(),
            session_key: "agent:a:webhook:m:x".into(),
            task: "t".into(),
            status: "queued".into(),
            client_id: "webhook:m".into(),
            started_at: at,
            ..RunRow::default()
        }
    }

    // The replay guard's behaviour is tested on both backends in `store::conformance`.

    #[tokio::test]
    async fn queued_runs_are_claimed_once_per_process_and_kept_by_the_sweep() {
        let (_d, s) = store().await;
        let s = s.for_node("p1".into());
        s.run_insert_queued(&queued("r2", 2), "{}").await.unwrap();
        s.run_insert_queued(&queued("r1", 1), "{}").await.unwrap();
        s.run_insert(&queued("plain", 3)).await.unwrap();
        let mut running = queued("busy", 4);
        running.status = "running".into();
        s.run_insert(&running).await.unwrap();
        // Held by this node: nothing to sweep; by a node that is gone: swept.
        assert_eq!(s.runs_orphan_unresumable(10, None).await.unwrap(), 0);
        let s = s.for_node("p2".into());
        assert_eq!(s.runs_orphan_unresumable(10, None).await.unwrap(), 2);
        assert_eq!(
            s.run_get(
                &crate::api::tenancy::Tenant::for_principal("admin", true),
                "plain"
            )
            .await
            .unwrap()
            .unwrap()
            .status,
            "orphaned"
        );
        assert_eq!(
            s.run_get(
                &crate::api::tenancy::Tenant::for_principal("admin", true),
                "busy"
            )
            .await
            .unwrap()
            .unwrap()
            .status,
            "orphaned"
        );
        // The process that queued them does not take them again; the next one does, once.
        assert!(s
            .clone()
            .for_node("p1".into())
            .runs_claim_queued(None)
            .await
            .unwrap()
            .is_empty());
        let claimed = s.runs_claim_queued(None).await.unwrap();
        let ids: Vec<&str> = claimed.iter().map(|c| c.row.run_id.as_str()).collect();
        assert_eq!(ids, ["r1", "r2"]);
        assert_eq!(claimed[0].resume, "{}");
        assert!(s.runs_claim_queued(None).await.unwrap().is_empty());
        s.run_mark_running("r1", 20).await.unwrap();
        let s = s.for_node("p3".into());
        assert!(s.runs_claim_queued(None).await.unwrap().len() == 1);
    }
}

/// Most runs `subagent.list` answers.
pub const RUNS_LISTED: i64 = 1000;

impl Store {
    /// Runs `tenant` reaches that are queued or running, or ended at or after `ended_since`
    /// (epoch ms): the newest started first, at most [`RUNS_LISTED`].
    pub async fn runs_list(
        &self,
        tenant: &Tenant,
        ended_since: i64,
    ) -> Result<Vec<RunRow>, GatewayError> {
        Ok(on_pool!(self.pool(), |p| {
            let rows = sqlx::query(
                "SELECT * FROM runs WHERE (completed_at IS NULL OR completed_at >= $1) \
                 AND ($2 IS NULL OR client_id = $2) ORDER BY started_at DESC, run_id LIMIT $3",
            )
            .bind(ended_since)
            .bind(tenant.only())
            .bind(RUNS_LISTED)
            .fetch_all(p)
            .await?;
            rows.iter().map(run_row).collect::<Result<Vec<_>, _>>()?
        }))
    }
}

/// Most runs one fleet report reads.
const RUNS_IN_REPORT: i64 = 100_000;

impl Store {
    /// Runs that started or ended within [start, end] (the fleet report's autonomy block).
    pub async fn runs_window(
        &self,
        start: i64,
        end: i64,
    ) -> Result<Vec<crate::store::records::RunFact>, GatewayError> {
        Ok(on_pool!(self.pool(), |p| {
            let rows = sqlx::query(
                "SELECT run_id, root_run_id, status, finish_reason, error, cost_usd FROM runs \
                 WHERE (started_at BETWEEN $1 AND $2) OR (completed_at BETWEEN $1 AND $2) \
                 ORDER BY started_at, run_id LIMIT $3",
            )
            .bind(start)
            .bind(end)
            .bind(RUNS_IN_REPORT)
            .fetch_all(p)
            .await?;
            rows.iter()
                .map(|r| {
                    Ok::<_, sqlx::Error>(crate::store::records::RunFact {
                        run_id: r.col("run_id")?,
                        root_run_id: r.col("root_run_id")?,
                        status: r.col("status")?,
                        finish_reason: r.col("finish_reason")?,
                        error: r.col("error")?,
                        cost_usd: r.col::<Option<f64>>("cost_usd")?.unwrap_or(0.0),
                    })
                })
                .collect::<Result<Vec<_>, _>>()?
        }))
    }
}

/// The runs below `$1` (itself included), for a [`StopScope::Subtree`] condition.
const SUBTREE: &str = "WITH RECURSIVE sub (run_id) AS (SELECT run_id FROM runs WHERE run_id = $1 \
     UNION ALL SELECT c.run_id FROM runs c JOIN sub ON c.parent_run_id = sub.run_id) ";

/// The condition on `runs r` that selects `scope`'s runs (after [`SUBTREE`]), and its `$1`.
fn scope_condition(scope: StopScope<'_>) -> (&'static str, &str) {
    match scope {
        StopScope::Tree(root) => ("r.root_run_id = $1", root),
        StopScope::Subtree(run) => ("r.run_id IN (SELECT run_id FROM sub)", run),
        StopScope::Run(run) => ("r.run_id = $1", run),
    }
}

/// Which runs a stop request names.
#[derive(Debug, Clone, Copy)]
pub enum StopScope<'a> {
    /// Every run of the tree under this root.
    Tree(&'a str),
    /// This run and every run below it.
    Subtree(&'a str),
    /// This one run.
    Run(&'a str),
}

/// A run another node holds that a stop request marked.
#[derive(Debug, Clone, PartialEq)]
pub struct Marked {
    pub run_id: String,
    /// What was requested of it before (None: nothing; `revoked`: its lease was revoked).
    pub before: Option<String>,
}

impl Store {
    /// Marks the unfinished runs of `scope` that other nodes hold with `what` (`killed` or
    /// `revoked`; a kill overrides a revocation, nothing overrides a kill); answers the runs
    /// marked, with what was requested of them before.
    pub async fn runs_request_stop(
        &self,
        scope: StopScope<'_>,
        what: &str,
    ) -> Result<Vec<Marked>, GatewayError> {
        let (cond, id) = scope_condition(scope);
        let select = format!(
            "{SUBTREE}SELECT r.run_id, r.stop_requested FROM runs r WHERE {cond} \
             AND r.completed_at IS NULL AND r.claimed_by IS NOT NULL AND r.claimed_by <> $2 \
             AND (r.stop_requested IS NULL OR (r.stop_requested = 'revoked' AND $3 = 'killed'))"
        );
        let marked: Vec<(String, Option<String>)> = on_pool!(self.pool(), |p| {
            sqlx::query_as(&select)
                .bind(id)
                .bind(self.node())
                .bind(what)
                .fetch_all(p)
                .await?
        });
        for (run_id, _) in &marked {
            on_pool!(self.pool(), |p| sqlx::query(
                "UPDATE runs SET stop_requested = $1 WHERE run_id = $2 AND completed_at IS NULL"
            )
            .bind(what)
            .bind(run_id)
            .execute(p)
            .await
            .map(drop))?;
        }
        Ok(marked
            .into_iter()
            .map(|(run_id, before)| Marked { run_id, before })
            .collect())
    }

    /// Stop requests for unfinished runs this node holds: (run id, killed | revoked).
    pub async fn runs_stops_for_me(&self) -> Result<Vec<(String, String)>, GatewayError> {
        Ok(on_pool!(self.pool(), |p| sqlx::query_as(
            "SELECT run_id, stop_requested FROM runs WHERE claimed_by = $1 \
             AND completed_at IS NULL AND stop_requested IS NOT NULL"
        )
        .bind(self.node())
        .fetch_all(p)
        .await?))
    }

    /// Which node holds an unfinished run (None: ended, unknown or held by nobody).
    pub async fn run_holder(&self, run_id: &str) -> Result<Option<String>, GatewayError> {
        Ok(
            on_pool!(self.pool(), |p| sqlx::query_scalar::<_, Option<String>>(
                "SELECT claimed_by FROM runs WHERE run_id = $1 AND completed_at IS NULL"
            )
            .bind(run_id)
            .fetch_optional(p)
            .await?)
            .flatten(),
        )
    }

    /// Whether every run of `ids` has ended.
    pub async fn runs_ended(&self, ids: &[String]) -> Result<bool, GatewayError> {
        for id in ids {
            let open: Option<String> = on_pool!(self.pool(), |p| sqlx::query_scalar(
                "SELECT run_id FROM runs WHERE run_id = $1 AND completed_at IS NULL"
            )
            .bind(id)
            .fetch_optional(p)
            .await?);
            if open.is_some() {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Queues a steering message for a run another node holds.
    pub async fn run_steer_add(&self, run_id: &str, message: &str) -> Result<(), GatewayError> {
        on_pool!(self.pool(), |p| sqlx::query(
            "INSERT INTO run_steering (run_id, message, created_at) VALUES ($1, $2, $3)"
        )
        .bind(run_id)
        .bind(message)
        .bind(crate::clock::now_ms())
        .execute(p)
        .await
        .map(drop))?;
        Ok(())
    }

    /// Takes the steering messages for runs this node holds: (run id, message), oldest first.
    pub async fn run_steering_take(&self) -> Result<Vec<(String, String)>, GatewayError> {
        let rows: Vec<(i64, String, String)> = on_pool!(self.pool(), |p| sqlx::query_as(
            "SELECT s.id, s.run_id, s.message FROM run_steering s JOIN runs r \
             ON r.run_id = s.run_id WHERE r.claimed_by = $1 ORDER BY s.id"
        )
        .bind(self.node())
        .fetch_all(p)
        .await?);
        for (id, _, _) in &rows {
            on_pool!(self.pool(), |p| sqlx::query(
                "DELETE FROM run_steering WHERE id = $1"
            )
            .bind(id)
            .execute(p)
            .await
            .map(drop))?;
        }
        Ok(rows.into_iter().map(|(_, r, m)| (r, m)).collect())
    }
}
