//! `scheduler`: cron jobs declared by the operator, the timer's limits and catch-up policy,
//! run-log retention, and the heartbeat defaults every agent starts from.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::ConfigError;
use crate::config::agents::HeartbeatSettings;

/// The message of a heartbeat tick when none is configured.
pub const HEARTBEAT_PROMPT: &str =
    "Heartbeat: check for pending work and report anything that needs attention. \
     Answer HEARTBEAT_OK when nothing does.";

/// Largest `scheduler.lateToleranceMs`: 7 days.
pub const MAX_LATE_TOLERANCE_MS: u64 = 604_800_000;
/// Largest `scheduler.fireTimeoutMs`: 24 hours.
pub const MAX_FIRE_TIMEOUT_MS: u64 = 86_400_000;
/// Largest `scheduler.runRetention.maxAgeDays`: 10 years.
pub const MAX_RUN_AGE_DAYS: u32 = 3_650;

/// `scheduler`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct SchedulerConfig {
    /// false: this node runs no timer (jobs stay editable; other nodes fire them).
    pub enabled: bool,
    /// Fires and heartbeat ticks running at once on this node (wake gates included).
    pub max_concurrent_runs: u32,
    /// What a job whose due time passed while no gateway ran does: `once` fires it once
    /// (however many fires were missed), `skip` waits for its next due time.
    pub missed_fires: MissedFires,
    /// A fire claimed within this time of its due time is on schedule; later it is a catch-up
    /// (at most 7 days).
    #[schemars(range(max = MAX_LATE_TOLERANCE_MS))]
    pub late_tolerance_ms: u64,
    /// A fire's agent turn ends (as an error) when it runs longer (at most 24 hours).
    #[schemars(range(max = MAX_FIRE_TIMEOUT_MS))]
    pub fire_timeout_ms: u64,
    /// Jobs one owner may hold (cron.add beyond it is -32002).
    pub max_jobs_per_owner: u32,
    /// How many finished fires are kept.
    pub run_retention: RunRetention,
    /// Heartbeat settings of every agent, under each agent's own `heartbeat`.
    pub heartbeat: HeartbeatSettings,
    /// Jobs declared by the operator, by name (owner `cron:config`, admin only). Seeded like
    /// agents: the file wins when an entry changed; a job removed from the file is deleted.
    pub jobs: BTreeMap<String, JobConfig>,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            max_concurrent_runs: 4,
            missed_fires: MissedFires::Once,
            late_tolerance_ms: 60_000,
            fire_timeout_ms: 600_000,
            max_jobs_per_owner: 1000,
            run_retention: RunRetention::default(),
            heartbeat: HeartbeatSettings::default(),
            jobs: BTreeMap::new(),
        }
    }
}

/// `scheduler.missedFires`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum MissedFires {
    Once,
    Skip,
}

/// `scheduler.runRetention`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct RunRetention {
    /// Newest finished fires kept per job.
    pub per_job: u32,
    /// Finished fires older than this are removed (hourly, once per fleet; at most 10 years).
    #[schemars(range(max = MAX_RUN_AGE_DAYS))]
    pub max_age_days: u32,
}

impl Default for RunRetention {
    fn default() -> Self {
        Self {
            per_job: 200,
            max_age_days: 30,
        }
    }
}

/// `scheduler.jobs.<name>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct JobConfig {
    /// The agent that runs the job (the default agent when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    /// The message of each fire.
    pub message: String,
    /// When it fires (as cron.add's `schedule`).
    pub schedule: ScheduleConfig,
    /// false: declared but paused.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// A check run before each fire that may skip the model turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wake_gate: Option<GateSpec>,
}

fn yes() -> bool {
    true
}

/// A schedule as written in the file (the catalogue's CronSchedule).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ScheduleConfig {
    pub kind: ScheduleKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expr: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tz: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
}

/// `scheduler.jobs.<name>.schedule.kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ScheduleKind {
    Cron,
    Interval,
    Once,
}

/// Rules serde cannot express (schedules, agents and gate paths are checked when the engine
/// opens, where the agents are known).
pub fn validate(s: &SchedulerConfig) -> Result<(), ConfigError> {
    if !(1..=1000).contains(&s.max_concurrent_runs) {
        return Err(ConfigError(
            "scheduler.maxConcurrentRuns must be between 1 and 1000".into(),
        ));
    }
    for (key, v) in [
        ("scheduler.fireTimeoutMs", s.fire_timeout_ms),
        ("scheduler.maxJobsPerOwner", u64::from(s.max_jobs_per_owner)),
        (
            "scheduler.runRetention.perJob",
            u64::from(s.run_retention.per_job),
        ),
        (
            "scheduler.runRetention.maxAgeDays",
            u64::from(s.run_retention.max_age_days),
        ),
    ] {
        if v == 0 {
            return Err(ConfigError(format!("{key} must be greater than 0")));
        }
    }
    for (key, v, max) in [
        (
            "scheduler.lateToleranceMs",
            s.late_tolerance_ms,
            MAX_LATE_TOLERANCE_MS,
        ),
        (
            "scheduler.fireTimeoutMs",
            s.fire_timeout_ms,
            MAX_FIRE_TIMEOUT_MS,
        ),
        (
            "scheduler.runRetention.maxAgeDays",
            u64::from(s.run_retention.max_age_days),
            u64::from(MAX_RUN_AGE_DAYS),
        ),
    ] {
        super::at_most(key, v, max)?;
    }
    Ok(())
}

/// A cron job's wake gate, as declared in the operator's configuration
/// (`scheduler.jobs.<name>.wakeGate`) and stored with the job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GateSpec {
    /// Path of the script, relative to the agent's workspace.
    pub script: String,
    /// Arguments passed verbatim (no shell).
    #[serde(default)]
    pub args: Vec<String>,
    /// Wall-clock limit for one run, `1..=300`; a gate that times out fails open.
    #[serde(default = "default_timeout")]
    pub timeout_seconds: u32,
}

fn default_timeout() -> u32 {
    10
}
