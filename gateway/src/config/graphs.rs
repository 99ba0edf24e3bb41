//! `graphs`: the defaults and limits of graph workflows (`graph.*`, docs/graphs.md).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::ConfigError;

/// Longest `graphs.runTimeoutMs` (and a definition's `timeoutMs`): 24 hours.
pub const MAX_RUN_TIMEOUT_MS: u64 = 86_400_000;
/// Longest `graphs.nodeTimeoutMs` (and a definition's `settings.nodeTimeoutMs`): 1 hour.
pub const MAX_NODE_TIMEOUT_MS: u64 = 3_600_000;
/// Shortest of both: 1 second.
pub const MIN_TIMEOUT_MS: u64 = 1_000;

/// `graphs`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct GraphsConfig {
    /// A run's timeout when its definition sets none (1 second to 24 hours).
    #[schemars(range(min = MIN_TIMEOUT_MS, max = MAX_RUN_TIMEOUT_MS))]
    pub run_timeout_ms: u64,
    /// A node attempt's timeout when the definition sets none (1 second to 1 hour).
    #[schemars(range(min = MIN_TIMEOUT_MS, max = MAX_NODE_TIMEOUT_MS))]
    pub node_timeout_ms: u64,
    /// Saved graphs one owner may hold (graph.save of a new id beyond it is -32002).
    #[schemars(range(min = 1))]
    pub max_saved_per_owner: u32,
    /// Runs one owner may have pending or running at once, fleet-wide (graph.execute beyond
    /// it is -32002).
    #[schemars(range(min = 1))]
    pub max_live_runs_per_owner: u32,
    /// Ended runs kept per owner (1 to 100,000): when a run ends, the owner's older ended
    /// runs past this many are deleted.
    #[schemars(range(min = 1, max = MAX_KEEP_RUNS))]
    pub keep_runs_per_owner: u32,
}

/// Most `graphs.keepRunsPerOwner`.
pub const MAX_KEEP_RUNS: u32 = 100_000;

impl Default for GraphsConfig {
    fn default() -> Self {
        Self {
            run_timeout_ms: 3_600_000,
            node_timeout_ms: 600_000,
            max_saved_per_owner: 1000,
            max_live_runs_per_owner: 16,
            keep_runs_per_owner: 1000,
        }
    }
}

/// Checks the ranges.
pub fn validate(c: &GraphsConfig) -> Result<(), ConfigError> {
    for (key, v, max) in [
        ("graphs.runTimeoutMs", c.run_timeout_ms, MAX_RUN_TIMEOUT_MS),
        (
            "graphs.nodeTimeoutMs",
            c.node_timeout_ms,
            MAX_NODE_TIMEOUT_MS,
        ),
    ] {
        if !(MIN_TIMEOUT_MS..=max).contains(&v) {
            return Err(ConfigError(format!(
                "{key} must be between {MIN_TIMEOUT_MS} and {max}"
            )));
        }
    }
    if c.max_saved_per_owner == 0 || c.max_live_runs_per_owner == 0 {
        return Err(ConfigError(
            "graphs.maxSavedPerOwner and graphs.maxLiveRunsPerOwner must be at least 1".to_owned(),
        ));
    }
    if !(1..=MAX_KEEP_RUNS).contains(&c.keep_runs_per_owner) {
        return Err(ConfigError(format!(
            "graphs.keepRunsPerOwner must be between 1 and {MAX_KEEP_RUNS}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_checked_at_and_past_each_bound() {
        let ok = GraphsConfig::default();
        assert!(validate(&ok).is_ok());
        for (run, node, fine) in [
            (MIN_TIMEOUT_MS, MIN_TIMEOUT_MS, true),
            (MAX_RUN_TIMEOUT_MS, MAX_NODE_TIMEOUT_MS, true),
            (MIN_TIMEOUT_MS - 1, MIN_TIMEOUT_MS, false),
            (MAX_RUN_TIMEOUT_MS + 1, MIN_TIMEOUT_MS, false),
            (MIN_TIMEOUT_MS, MIN_TIMEOUT_MS - 1, false),
            (MIN_TIMEOUT_MS, MAX_NODE_TIMEOUT_MS + 1, false),
        ] {
            let c = GraphsConfig {
                run_timeout_ms: run,
                node_timeout_ms: node,
                ..ok.clone()
            };
            assert_eq!(validate(&c).is_ok(), fine, "{run} {node}");
        }
        for (saved, live) in [(0, 1), (1, 0)] {
            let c = GraphsConfig {
                max_saved_per_owner: saved,
                max_live_runs_per_owner: live,
                ..ok.clone()
            };
            assert!(validate(&c).is_err());
        }
        for (keep, fine) in [
            (1, true),
            (MAX_KEEP_RUNS, true),
            (0, false),
            (MAX_KEEP_RUNS + 1, false),
        ] {
            let c = GraphsConfig {
                keep_runs_per_owner: keep,
                ..ok.clone()
            };
            assert_eq!(validate(&c).is_ok(), fine, "keep {keep}");
        }
    }
}
