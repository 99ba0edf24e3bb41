//! Observability: the recorders that write the session index, diagnostic events and system
//! prompt reports behind the request; the reports built from what they stored (`obs.explain`,
//! `obs.fleet.health`); the `where` filter of `obs.trace.search`; and the Prometheus metrics.

pub mod explain;
pub mod filter;
pub mod fleet;
pub mod recorder;
pub mod records;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use crate::api::generated::types::ObsContextBudget;
use crate::config::ObservabilityConfig;
use crate::store::Store;

/// What one server generation keeps for observability in memory.
#[derive(Debug, Default)]
pub struct ObsState {
    pub config: ObservabilityConfig,
    /// The context budget of each agent's last turn (obs.context.pipeline).
    last_budgets: Mutex<HashMap<String, ObsContextBudget>>,
}

impl ObsState {
    pub fn new(config: ObservabilityConfig) -> Arc<Self> {
        Arc::new(Self {
            config,
            last_budgets: Mutex::default(),
        })
    }

    /// Remembers an agent's last context budget.
    pub fn set_budget(&self, agent_id: &str, b: &ObsContextBudget) {
        if let Ok(mut m) = self.last_budgets.lock() {
            match m.get_mut(agent_id) {
                Some(slot) => *slot = b.clone(),
                None => {
                    m.insert(agent_id.to_owned(), b.clone());
                }
            }
        }
    }

    /// An agent's last context budget.
    pub fn budget(&self, agent_id: &str) -> Option<ObsContextBudget> {
        self.last_budgets.lock().ok()?.get(agent_id).cloned()
    }

    /// Start of the session index's horizon at `now` (epoch ms).
    pub fn trace_horizon(&self, now: i64) -> i64 {
        now - i64::from(self.config.trace_retention_hours) * 3_600_000
    }
}

/// Sweeps expired observability rows every `sweepIntervalSeconds` while `state` lives.
pub fn spawn_sweeper(state: Weak<ObsState>, store: Store) {
    tokio::spawn(async move {
        loop {
            let Some(every) = state
                .upgrade()
                .map(|s| Duration::from_secs(s.config.sweep_interval_seconds.max(1)))
            else {
                return;
            };
            tokio::time::sleep(every).await;
            let Some(s) = state.upgrade() else { return };
            let now = crate::clock::now_ms();
            let c = &s.config;
            let swept = store
                .obs_sweep(
                    s.trace_horizon(now),
                    now - i64::from(c.diagnostics_retention_hours) * 3_600_000,
                    i64::from(c.prompt_reports_per_session),
                )
                .await;
            match swept {
                Ok(0) => {}
                Ok(n) => tracing::debug!(rows = n, "observability rows swept"),
                Err(e) => tracing::warn!(error = %e, "observability sweep failed"),
            }
        }
    });
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_errors_are_classified_by_their_wording() {
        for (text, kind) in [
            ("unknown tool: x", "not_available"),
            ("tool not available to this agent: x", "not_available"),
            (
                "not run: the same call was already made in this turn",
                "repeated_call",
            ),
            ("invalid arguments: 'query' is required", "invalid_args"),
            ("request timed out after 30 s", "timeout"),
            ("Permission denied", "denied"),
            ("file not found: a.txt", "not_found"),
            ("result too large", "limit"),
            ("boom", "failed"),
        ] {
            assert_eq!(classify_tool_error(text), kind, "{text}");
        }
        assert_eq!(digest("x").len(), "sha256:".len() + 16);
        assert_eq!(digest("x"), digest("x"));
        assert_ne!(digest("x"), digest("y"));
    }
}
