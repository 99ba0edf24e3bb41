//! Observability: the recorders that write the session index, diagnostic events and system
//! prompt reports behind the request; the reports built from what they stored (`obs.explain`,
//! `obs.fleet.health`); the `where` filter of `obs.trace.search`; and the Prometheus metrics.

pub mod explain;
pub mod health;
pub mod orchestrate;
pub mod recorder;

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
    #[allow(
        clippy::disallowed_methods,
        reason = "the sweeper holds the observability state weakly and ends with it"
    )]
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

#[cfg(test)]
mod tests {
    use crate::store::records::{classify_tool_error, digest};

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
