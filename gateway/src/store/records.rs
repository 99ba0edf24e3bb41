//! The stored facts the post-mortem reports are built from: read by `store/obs.rs`, turned
//! into reports by [`super::explain`] and [`super::nodes`], which are pure functions of these
//! (no clock, no store), so the same facts always give the same bytes.
//!
//! Everything here is content-free: names, counts, timings, codes and digests.

use crate::api::generated::types::{ObsContextBudget, ObsCronWakeGateRun, ObsOrchestrateRun};

/// Which parameter of `obs.explain` named the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefKind {
    SessionKey,
    TraceId,
    RootRunId,
}

impl RefKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::SessionKey => "sessionKey",
            Self::TraceId => "traceId",
            Self::RootRunId => "rootRunId",
        }
    }
}

/// `depth` of `obs.explain`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Depth {
    /// About 6 KB, capped lists.
    Summary,
    /// Relaxed caps.
    Full,
}

/// What `obs.explain` was asked, and what the store found for it.
#[derive(Debug, Clone, PartialEq)]
pub struct ExplainInput {
    pub kind: RefKind,
    /// The reference as given.
    pub value: String,
    pub depth: Depth,
    /// None when the reference resolved to no session.
    pub session: Option<SessionFacts>,
}

/// One session's stored records.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SessionFacts {
    pub session_key: String,
    pub agent_id: Option<String>,
    /// The channel kind (api, webhook, cron, heartbeat, v1).
    pub channel: Option<String>,
    /// First and last change of the session, epoch ms.
    pub created_at: i64,
    pub updated_at: i64,
    /// Turns run (the session's counter; for an ephemeral turn 1).
    pub turns: i64,
    /// The last turn's finish reason (stop, max_steps, budget_exceeded, circuit_open,
    /// context_loop, error); None when no turn was recorded.
    pub last_finish_reason: Option<String>,
    /// With finish reason error: the model call's error kind (timeout, rate_limited, ...).
    pub last_error_kind: Option<String>,
    /// The trace id of the last turn, when the index still has it.
    pub last_trace_id: Option<String>,
    /// Every tool result of the transcript, in transcript order (seq ascending).
    pub tool_results: Vec<ToolResultFact>,
    /// The session's model calls.
    pub usage: UsageFacts,
    /// The session's rows of the session index (seq, then id order); empty when swept.
    pub trace: Vec<TraceFact>,
    /// The context budget of the last turn, when its turn_end row is still indexed.
    pub context_budget: Option<ObsContextBudget>,
    /// The cron wake gate decision of the newest gated fire of the session's job, if any.
    pub cron_gate: Option<ObsCronWakeGateRun>,
    /// The wake gate runs of the session's job (its gated fires), newest first.
    pub orchestrate: Vec<ObsOrchestrateRun>,
    /// Synthetic records (heartbeats, wake gates, probes) are counted.
    pub include_synthetic: bool,
}

/// One tool result of the transcript.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolResultFact {
    /// Its position in the transcript.
    pub seq: i64,
    pub tool_name: String,
    pub is_error: bool,
    /// `sha256:` + the first 16 hex digits of the SHA-256 of the result text.
    pub digest: String,
    /// Size of the result text in bytes.
    pub bytes: i64,
    /// For failures: the classification of [`classify_tool_error`].
    pub error_kind: Option<String>,
    /// For memory_search results: how many memories were returned.
    pub recall_hits: Option<i64>,
}

/// The model calls of a session, summed.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct UsageFacts {
    pub calls: i64,
    pub failed_calls: i64,
    pub input_tokens: i64,
    pub output_tokens: i64,
    pub cached_tokens: i64,
    pub cost_usd: f64,
}

/// One row of the session index.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TraceFact {
    pub ts: i64,
    pub seq: i64,
    /// inbound | outbound | tool_result | turn_end | error
    pub kind: String,
    pub trace_id: String,
    pub session_key: String,
    pub agent_id: Option<String>,
    pub tool_name: Option<String>,
    /// ok | error | skipped
    pub status: Option<String>,
    pub duration_ms: Option<i64>,
    pub tokens: Option<i64>,
    pub cost_usd: Option<f64>,
    pub finish_reason: Option<String>,
    pub error_kind: Option<String>,
    /// For tool results: the digest and size of the result (as [`ToolResultFact`]).
    pub result_digest: Option<String>,
    pub result_bytes: Option<i64>,
    pub synthetic: bool,
}

/// What `obs.fleet.health` reads for its window.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FleetInput {
    pub since_hours: f64,
    pub start_ms: i64,
    pub end_ms: i64,
    /// The turn_end and tool_result rows of the window (non-synthetic), in (ts, id) order.
    pub rows: Vec<TraceFact>,
    /// Model calls of the window (from the billing rollup).
    pub cost: UsageFacts,
    /// Turns whose served model was not the agent's configured primary (a fallback answered).
    pub served_below_configured: i64,
    /// Failed model calls of the window, per error kind (provider health).
    pub provider_failures: Vec<(String, i64)>,
    /// Gated cron fires of the window: (agent id, decision: wake | skip | failed_open,
    /// tool calls, estimated turns saved).
    pub gate_fires: Vec<GateFire>,
    /// Background runs that started or ended in the window (the autonomy block; empty: no
    /// block).
    pub runs: Vec<RunFact>,
}

/// One background run, as the fleet report reads it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunFact {
    pub run_id: String,
    pub root_run_id: String,
    pub status: String,
    pub finish_reason: Option<String>,
    pub error: Option<String>,
    pub cost_usd: f64,
}

/// One gated cron fire.
#[derive(Debug, Clone, PartialEq)]
pub struct GateFire {
    pub agent_id: String,
    pub skipped: bool,
    pub failed_open: bool,
    pub tool_calls: i64,
    pub turns_saved: i64,
    /// Its gate's socket calls past every check, and refused by one.
    pub calls_allowed: i64,
    pub calls_denied: i64,
}

/// What a fire records of its wake gate (`cron_runs.gate`, JSON): the decision, and the run
/// the gate's process was (its lease, exit code, failure class and socket calls). Records
/// written before the run members existed have only the first three.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GateRecord {
    /// wake | skip | failed_open
    pub decision: String,
    pub duration_ms: i64,
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// timeout | stdout_cap | nonzero_exit | spawn_fail | lease_absent; None when the gate ran
    /// to a decision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_class: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<GateCall>,
    /// Calls past the kept groups (counted only).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub calls_dropped: i64,
    #[serde(default)]
    pub result_count: i64,
    #[serde(default)]
    pub result_bytes: i64,
}

/// One stored gated fire of a job.
#[derive(Debug, Clone, PartialEq)]
pub struct GatedFire {
    pub job_id: String,
    pub record: GateRecord,
    pub tool_calls: Option<i64>,
    pub est_turns_saved: Option<i64>,
}

/// Calls of a gate with one tool, capability and decision (allowed | denied).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GateCall {
    pub tool: String,
    pub capability: String,
    pub decision: String,
    pub count: i64,
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

impl GateRecord {
    /// Socket calls past every check, and refused by one.
    pub fn calls(&self) -> (i64, i64) {
        let sum = |d: &str| {
            self.tool_calls
                .iter()
                .filter(|c| c.decision == d)
                .map(|c| c.count)
                .sum::<i64>()
        };
        (sum("allowed"), sum("denied"))
    }
}

/// The short error kind of a failed tool result, from its text: the gateway's own refusals
/// have fixed wording, a tool's own failure is classified by the words it uses. Deterministic,
/// so the index (at record time) and `obs.explain` (over a stored transcript) agree; a wrong
/// guess is what the `content_heuristic_misclassification` root cause is about.
pub fn classify_tool_error(text: &str) -> &'static str {
    let head: String = text.chars().take(200).collect::<String>().to_lowercase();
    let has = |words: &[&str]| words.iter().any(|w| head.contains(w));
    if has(&["unknown tool", "tool not available"]) {
        "not_available"
    } else if has(&["not run: the same call"]) {
        "repeated_call"
    } else if has(&["invalid arguments", "invalid argument", "missing required"]) {
        "invalid_args"
    } else if has(&["timed out", "timeout", "deadline"]) {
        "timeout"
    } else if has(&[
        "denied",
        "forbidden",
        "not allowed",
        "permission",
        "unauthorized",
    ]) {
        "denied"
    } else if has(&["not found", "no such", "does not exist"]) {
        "not_found"
    } else if has(&["too large", "too long", "limit"]) {
        "limit"
    } else {
        "failed"
    }
}

/// How many memories a `memory_search` result returned (its `results` array), 0 when the
/// text is not such a result.
pub fn recall_hits(text: &str) -> i64 {
    serde_json::from_str::<serde_json::Value>(text)
        .ok()
        .and_then(|v| v.get("results").and_then(|r| r.as_array()).map(Vec::len))
        .unwrap_or(0) as i64
}

/// `sha256:` + the first 16 hex digits of the SHA-256 of `text`: identical results share it.
pub fn digest(text: &str) -> String {
    use sha2::{Digest, Sha256};
    let d = Sha256::digest(text.as_bytes());
    format!("sha256:{}", hex::encode(&d[..8]))
}
