//! Cron jobs as the `cron.*` methods and the configuration file see them: creating, changing,
//! removing, listing and firing jobs on request, and their wire forms.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::Scheduler;
use crate::api::error::GatewayError;
use crate::api::generated::types as wire;
use crate::api::tenancy::Tenant;
use crate::clock::now_ms;
use crate::config::scheduler::GateSpec;
use crate::config::scheduler::{JobConfig, MissedFires, ScheduleConfig, ScheduleKind};
use crate::runtime::agents::Agents;
use crate::runtime::scheduler::schedule::{self, Invalid, Kind, Schedule, ScheduleSpec, Trigger};
use crate::runtime::scheduler::FireSlots;
use crate::store::scheduler::{ClaimKind, FireRow, JobRow, CONFIG_OWNER};

/// Whether `name` has the form of a job id (`job_<32 hex>`): such names address jobs by id.
pub fn is_job_id(name: &str) -> bool {
    name.strip_prefix("job_")
        .is_some_and(|h| h.len() == 32 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

fn kind_of(k: wire::CronScheduleKind) -> Kind {
    match k {
        wire::CronScheduleKind::Cron => Kind::Cron,
        wire::CronScheduleKind::Interval => Kind::Interval,
        wire::CronScheduleKind::Once => Kind::Once,
    }
}

fn invalid(e: Invalid) -> GatewayError {
    GatewayError::InvalidParams(format!("{}: {}", e.member, e.why))
}

/// Judges a schedule as a client sent it.
pub fn parse(s: &wire::CronSchedule, now: i64) -> Result<Schedule, GatewayError> {
    Schedule::parse(
        &ScheduleSpec {
            kind: kind_of(s.kind),
            expr: s.expr.as_deref(),
            tz: s.tz.as_deref(),
            every_ms: s.every_ms,
            at: s.at.as_deref(),
        },
        now,
    )
    .map_err(invalid)
}

/// A schedule written in the configuration file, in its wire form.
pub fn schedule_of_config(s: &ScheduleConfig) -> wire::CronSchedule {
    let kind = match s.kind {
        ScheduleKind::Cron => wire::CronScheduleKind::Cron,
        ScheduleKind::Interval => wire::CronScheduleKind::Interval,
        ScheduleKind::Once => wire::CronScheduleKind::Once,
    };
    wire::CronSchedule {
        kind,
        expr: s.expr.clone(),
        tz: s.tz.clone(),
        every_ms: s.every_ms,
        at: s.at.clone(),
    }
}

/// The stored schedule of a job.
pub fn stored_schedule(j: &JobRow) -> Result<wire::CronSchedule, GatewayError> {
    serde_json::from_str(&j.schedule).map_err(|e| {
        GatewayError::Internal(format!(
            "cron job {}: stored schedule unreadable: {e}",
            j.job_id
        ))
    })
}

/// The schedule of a stored job as the timer uses it. A stored `once` whose time has passed is
/// still a valid schedule (it is judged against the epoch, not now).
pub fn job_schedule(j: &JobRow) -> Result<Schedule, GatewayError> {
    parse(&stored_schedule(j)?, 0)
}

fn to_json<T: serde::Serialize>(v: &T) -> Result<String, GatewayError> {
    serde_json::to_string(v).map_err(|e| GatewayError::Internal(e.to_string()))
}

/// A job as cron.list and cron.status show it.
pub fn job_to_wire(j: &JobRow) -> Result<wire::CronJob, GatewayError> {
    let s = stored_schedule(j)?;
    let gate: Option<GateSpec> = j
        .wake_gate
        .as_deref()
        .and_then(|g| serde_json::from_str(g).ok());
    let last_status = j.last_status.as_deref().and_then(|s| match s {
        "ok" => Some(wire::CronJobLastStatus::Ok),
        "error" => Some(wire::CronJobLastStatus::Error),
        "skipped" => Some(wire::CronJobLastStatus::Skipped),
        _ => None,
    });
    Ok(wire::CronJob {
        id: j.job_id.clone(),
        name: j.name.clone(),
        agent_id: j.agent_id.clone(),
        message: j.message.clone(),
        schedule_kind: s.kind,
        expr: s.expr,
        tz: s.tz,
        every_ms: s.every_ms,
        at: s.at,
        owner: j.owner.clone(),
        next_run_at_ms: if j.enabled { j.next_due_at } else { None },
        enabled: j.enabled,
        last_run_at_ms: j.last_run_at,
        last_status,
        last_error: j.last_error.clone(),
        wake_gate: gate.map(|g| wire::CronJobWakeGate {
            script: g.script,
            args: (!g.args.is_empty()).then_some(g.args),
            timeout_seconds: i64::from(g.timeout_seconds),
        }),
    })
}

/// A fire as cron.runs shows it.
pub fn fire_to_wire(f: &FireRow) -> wire::CronRun {
    let status = match f.status.as_str() {
        "ok" => wire::CronRunStatus::Ok,
        "skipped" => wire::CronRunStatus::Skipped,
        _ => wire::CronRunStatus::Error,
    };
    let trigger = match f.trigger.as_str() {
        "catch_up" => wire::CronRunTrigger::CatchUp,
        "force" => wire::CronRunTrigger::Force,
        "due" => wire::CronRunTrigger::Due,
        _ => wire::CronRunTrigger::Schedule,
    };
    wire::CronRun {
        ts: f.ts,
        job_id: f.job_id.clone(),
        status,
        duration_ms: f.duration_ms.unwrap_or(0).max(0),
        summary: f.summary.clone(),
        error: f.error.clone(),
        tool_calls: f.tool_calls,
        est_turns_saved: f.est_turns_saved,
        root_run_id: f.root_run_id.clone(),
        due_at_ms: f.due_at,
        trigger,
        gate: f.gate.as_deref().and_then(gate_of),
    }
}

/// The wire form of a fire's stored gate record (its decision, and the gate's run id).
pub fn gate_of(stored: &str) -> Option<wire::CronRunGate> {
    let r: crate::store::records::GateRecord = serde_json::from_str(stored).ok()?;
    Some(wire::CronRunGate {
        decision: wire::CronRunGateDecision::from_wire(&r.decision)?,
        duration_ms: r.duration_ms.max(0),
        reason: r.reason,
        run_id: r.run_id,
    })
}

/// The first due time of a schedule starting now (an interval job is anchored at `now`).
fn first_due(schedule: &Schedule, now: i64) -> Option<i64> {
    schedule.next_after(now, now)
}

impl Scheduler {
    /// Tells every timer (this node's and, on a shared database, the others') to look again.
    pub async fn changed(&self) {
        super::rearm(&self.control);
        self.store.announce(super::ANNOUNCE).await;
    }

    /// cron.add: a new job of `owner`.
    pub async fn cron_add(
        &self,
        owner: &str,
        name: &str,
        message: &str,
        agent_id: Option<&str>,
        schedule: &wire::CronSchedule,
    ) -> Result<JobRow, GatewayError> {
        if is_job_id(name) {
            return Err(GatewayError::InvalidParams(
                "name: job_<32 hex> is the form of job ids; choose another name".into(),
            ));
        }
        let agent_id = self.agents.require_or_default(agent_id)?.id.clone();
        let now = now_ms();
        let parsed = parse(schedule, now)?;
        let row = JobRow {
            job_id: format!("job_{}", uuid::Uuid::new_v4().simple()),
            owner: owner.to_owned(),
            name: name.to_owned(),
            agent_id,
            message: message.to_owned(),
            kind: schedule.kind.as_str().to_owned(),
            schedule: to_json(schedule)?,
            anchor_at: now,
            enabled: true,
            next_due_at: first_due(&parsed, now),
            created_at: now,
            updated_at: now,
            ..JobRow::default()
        };
        self.store
            .cron_insert(&row, i64::from(self.config.max_jobs_per_owner))
            .await?;
        self.changed().await;
        Ok(row)
    }

    /// The job `name` within the caller's reach, or -32001.
    pub async fn cron_require(
        &self,
        tenant: &Tenant,
        caller: &str,
        name: &str,
    ) -> Result<JobRow, GatewayError> {
        self.store
            .cron_job(tenant, caller, name)
            .await?
            .ok_or_else(|| GatewayError::not_found("Cron job", name))
    }

    /// cron.update: the given members change; whether anything did, and the job after.
    pub async fn cron_update(
        &self,
        mut job: JobRow,
        p: &wire::CronUpdateParams,
    ) -> Result<(bool, JobRow), GatewayError> {
        let now = now_ms();
        let before = job.clone();
        if let Some(m) = &p.message {
            job.message = m.clone();
        }
        if let Some(a) = &p.agent_id {
            job.agent_id = self.agents.require(a)?.id.clone();
        }
        let mut replan = false;
        if let Some(s) = &p.schedule {
            let text = to_json(s)?;
            if text != job.schedule {
                parse(s, now)?;
                job.schedule = text;
                job.kind = s.kind.as_str().to_owned();
                job.anchor_at = now;
                replan = true;
            }
        }
        if let Some(e) = p.enabled {
            if e && !job.enabled {
                replan = true;
            }
            job.enabled = e;
        }
        if replan && job.enabled {
            let parsed = parse(&stored_schedule(&job)?, now).map_err(|e| {
                if p.schedule.is_none() {
                    GatewayError::InvalidParams(
                        "enabled: this once job has fired; give it a new schedule".into(),
                    )
                } else {
                    e
                }
            })?;
            if job.kind == "interval" && p.schedule.is_none() {
                job.anchor_at = now;
            }
            job.next_due_at = first_due(&parsed, now);
            if job.next_due_at.is_none() {
                return Err(GatewayError::InvalidParams(
                    "enabled: this job will not fire again; give it a new schedule".into(),
                ));
            }
        }
        if job == before {
            return Ok((false, job));
        }
        job.updated_at = now;
        self.store.cron_save(&job, replan).await?;
        self.changed().await;
        Ok((true, job))
    }

    /// cron.remove.
    pub async fn cron_remove(&self, job: &JobRow) -> Result<(), GatewayError> {
        self.store.cron_delete(&job.job_id).await?;
        self.changed().await;
        Ok(())
    }

    /// cron.run force: fires `job` now on this node, whatever its schedule. -32002 when it is
    /// firing already or every fire slot is taken.
    pub async fn cron_force(self: &Arc<Self>, job: JobRow) -> Result<(), GatewayError> {
        let Some(slot) = FireSlots::take(&self.control, self.fire_limit()) else {
            return Err(GatewayError::Busy(format!(
                "Every scheduler slot is taken (scheduler.maxConcurrentRuns {}); try again",
                self.config.max_concurrent_runs
            )));
        };
        let now = now_ms();
        let Some(claimed) = self
            .store
            .cron_claim(&job, ClaimKind::Manual, "force", now)
            .await?
        else {
            return Err(GatewayError::Conflict(format!(
                "Cron job {} is firing now",
                job.name
            )));
        };
        super::fire::spawn(self.clone(), job, claimed, "force", slot);
        Ok(())
    }

    /// Fires the jobs due at `now` (of `owner` only, when given) while fire slots are free,
    /// all claimed in one transaction; the names of the fires started. The timer passes no
    /// trigger and the catch-up policy decides; cron.run due passes `due` and fires every
    /// overdue job it reaches, whatever the policy.
    pub async fn fire_due(
        self: &Arc<Self>,
        now: i64,
        owner: Option<&str>,
        trigger: Option<&'static str>,
    ) -> Result<Vec<String>, GatewayError> {
        let max = self.fire_limit();
        let free = max.saturating_sub(self.control.fire_slots.running());
        if free == 0 {
            return Ok(Vec::new());
        }
        let policy = match self.config.missed_fires {
            MissedFires::Once => schedule::MissedFires::Once,
            MissedFires::Skip => schedule::MissedFires::Skip,
        };
        let tolerance = i64::try_from(self.config.late_tolerance_ms).unwrap_or(i64::MAX);
        let limit = i64::try_from(free).unwrap_or(i64::MAX);
        let mut batch = Vec::new();
        for job in self.store.cron_due(now, owner, limit).await? {
            let Some(due) = job.next_due_at else { continue };
            let schedule = match job_schedule(&job) {
                Ok(s) => s,
                Err(e) => {
                    tracing::error!(job = %job.job_id, error = %e, "cron job unreadable; disabled");
                    self.store.cron_advance(&job.job_id, due, None, now).await?;
                    continue;
                }
            };
            let plan = schedule::plan(&schedule, job.anchor_at, due, now, policy, tolerance);
            let fire = match (trigger, plan.fire) {
                (Some(t), _) => t,
                (None, Some(Trigger::Schedule)) => "schedule",
                (None, Some(Trigger::CatchUp)) => "catch_up",
                (None, None) => {
                    self.store
                        .cron_advance(&job.job_id, due, plan.next, now)
                        .await?;
                    continue;
                }
            };
            let Some(slot) = FireSlots::take(&self.control, max) else {
                break;
            };
            let claim = ClaimKind::Scheduled {
                due,
                next: plan.next,
            };
            batch.push((job, claim, fire, slot));
        }
        // One commit however many fires are due in the same instant; each record takes the
        // instant of the claim.
        let mut started = Vec::new();
        if !batch.is_empty() {
            let claims: Vec<_> = batch.iter().map(|(j, c, t, _)| (j, *c, *t)).collect();
            let won = self.store.cron_claims(&claims, now_ms()).await?;
            for ((job, _, fire, slot), claimed) in batch.into_iter().zip(won) {
                if let Some(claimed) = claimed {
                    started.push(job.name.clone());
                    super::fire::spawn(self.clone(), job, claimed, fire, slot);
                }
            }
        }
        Ok(started)
    }

    /// Fires and ticks this node may run at once.
    pub fn fire_limit(&self) -> usize {
        usize::try_from(self.config.max_concurrent_runs).unwrap_or(1)
    }

    /// Writes the configuration file's jobs (owner `cron:config`): a new entry is added, a
    /// changed one replaces the stored job (its run log stays), and a job no longer in the
    /// file is deleted.
    pub async fn seed_jobs(&self) -> Result<(), GatewayError> {
        let now = now_ms();
        let mut stored: std::collections::BTreeMap<String, JobRow> = self
            .store
            .cron_config_jobs()
            .await?
            .into_iter()
            .map(|j| (j.name.clone(), j))
            .collect();
        for (name, cfg) in &self.config.jobs {
            let row = config_job(&self.agents, name, cfg, now)?;
            match stored.remove(name) {
                None => {
                    self.store.cron_insert(&row, i64::MAX).await?;
                }
                Some(old) if old.seed_hash != row.seed_hash => {
                    let job = JobRow {
                        job_id: old.job_id,
                        created_at: old.created_at,
                        ..row
                    };
                    self.store.cron_save(&job, true).await?;
                }
                Some(_) => {}
            }
        }
        for gone in stored.values() {
            self.store.cron_delete(&gone.job_id).await?;
        }
        super::rearm(&self.control);
        Ok(())
    }
}

/// Judges every job of the configuration file (check-config and restarts run it).
pub fn check_config_jobs(
    agents: &Agents,
    jobs: &BTreeMap<String, JobConfig>,
) -> Result<(), GatewayError> {
    for (name, cfg) in jobs {
        config_job(agents, name, cfg, now_ms())?;
    }
    Ok(())
}

/// The row a configuration-file job is stored as.
fn config_job(
    agents: &Agents,
    name: &str,
    cfg: &JobConfig,
    now: i64,
) -> Result<JobRow, GatewayError> {
    config_job_row(agents, name, cfg, now)
        .map_err(|e| GatewayError::InvalidParams(format!("scheduler.jobs.{name}.{e}")))
}

/// [`config_job`], its errors naming the member without the `scheduler.jobs.<name>.` prefix.
fn config_job_row(
    agents: &Agents,
    name: &str,
    cfg: &JobConfig,
    now: i64,
) -> Result<JobRow, String> {
    if name.is_empty() || name.len() > 200 || is_job_id(name) {
        return Err("name: 1-200 characters, not of the form job_<32 hex>".into());
    }
    if cfg.message.is_empty() {
        return Err("message: must not be empty".into());
    }
    let agent_id = agents
        .require_or_default(cfg.agent_id.as_deref())
        .map_err(|e| format!("agentId: {e}"))?
        .id
        .clone();
    let schedule = schedule_of_config(&cfg.schedule);
    let parsed = parse(&schedule, 0).map_err(|e| e.to_string())?;
    let gate = match &cfg.wake_gate {
        Some(spec) => {
            super::gate::check_spec(spec).map_err(|e| format!("wakeGate: {e}"))?;
            Some(to_json(spec).map_err(|e| e.to_string())?)
        }
        None => None,
    };
    let schedule_json = to_json(&schedule).map_err(|e| e.to_string())?;
    let hash_of = serde_json::json!({"agent": agent_id, "message": cfg.message,
            "schedule": schedule_json, "enabled": cfg.enabled, "gate": gate});
    let seed_hash = crate::providers::registry::seed_hash(&hash_of.to_string());
    Ok(JobRow {
        job_id: format!("job_{}", uuid::Uuid::new_v4().simple()),
        owner: CONFIG_OWNER.to_owned(),
        name: name.to_owned(),
        agent_id,
        message: cfg.message.clone(),
        kind: schedule.kind.as_str().to_owned(),
        schedule: schedule_json,
        anchor_at: now,
        enabled: cfg.enabled,
        wake_gate: gate,
        next_due_at: first_due(&parsed, now),
        seed_hash: Some(seed_hash),
        created_at: now,
        updated_at: now,
        ..JobRow::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_ids_are_recognised() {
        assert!(is_job_id("job_0123456789abcdef0123456789abcdef"));
        assert!(!is_job_id("job_0123456789abcdef0123456789abcde"));
        assert!(!is_job_id("job_0123456789abcdef0123456789abcdeg"));
        assert!(!is_job_id("standup"));
    }
}
