//! `agentDefaults.context`: when and how the summary tree of a conversation is built.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::ConfigError;

/// `agentDefaults.context`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct ContextConfig {
    /// Summaries are built when the history a turn would send (top-level summaries plus the
    /// messages they do not cover) passes this share of the model's input budget (its window
    /// less the output reserve, the agent prompt and the new message).
    pub summarize_at_share: f64,
    /// The newest messages that are never summarised: they always reach the model verbatim.
    pub keep_recent_messages: u32,
    /// Most messages one leaf summary covers (a tool call and its results are never split,
    /// so a single longer tool exchange makes a longer leaf).
    pub leaf_max_messages: u32,
    /// This many consecutive top-level nodes of one depth are condensed into one node a level
    /// up.
    pub condense_fanout: u32,
    /// Longest summary a summarize call may write, in tokens.
    pub summary_max_tokens: u32,
}

impl Default for ContextConfig {
    fn default() -> Self {
        Self {
            summarize_at_share: 0.75,
            keep_recent_messages: 8,
            leaf_max_messages: 24,
            condense_fanout: 4,
            summary_max_tokens: 512,
        }
    }
}

/// Checks the ranges of `agentDefaults.context`.
pub fn validate(c: &ContextConfig) -> Result<(), ConfigError> {
    let bad = |what: &str| Err(ConfigError(format!("agentDefaults.context.{what}")));
    // NaN fails the range check too.
    if !(c.summarize_at_share > 0.0 && c.summarize_at_share <= 1.0) {
        return bad("summarizeAtShare must be greater than 0 and at most 1");
    }
    if c.keep_recent_messages > 1000 {
        return bad("keepRecentMessages must be 0 to 1000");
    }
    if !(2..=1000).contains(&c.leaf_max_messages) {
        return bad("leafMaxMessages must be 2 to 1000");
    }
    if !(2..=64).contains(&c.condense_fanout) {
        return bad("condenseFanout must be 2 to 64");
    }
    if !(32..=32_768).contains(&c.summary_max_tokens) {
        return bad("summaryMaxTokens must be 32 to 32768");
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_ranges_are_checked() {
        assert!(validate(&ContextConfig::default()).is_ok());
        let cases = [
            (
                ContextConfig {
                    summarize_at_share: 0.0,
                    ..Default::default()
                },
                "summarizeAtShare",
            ),
            (
                ContextConfig {
                    summarize_at_share: 1.5,
                    ..Default::default()
                },
                "summarizeAtShare",
            ),
            (
                ContextConfig {
                    summarize_at_share: f64::NAN,
                    ..Default::default()
                },
                "summarizeAtShare",
            ),
            (
                ContextConfig {
                    keep_recent_messages: 1001,
                    ..Default::default()
                },
                "keepRecentMessages",
            ),
            (
                ContextConfig {
                    leaf_max_messages: 1,
                    ..Default::default()
                },
                "leafMaxMessages",
            ),
            (
                ContextConfig {
                    condense_fanout: 1,
                    ..Default::default()
                },
                "condenseFanout",
            ),
            (
                ContextConfig {
                    summary_max_tokens: 8,
                    ..Default::default()
                },
                "summaryMaxTokens",
            ),
        ];
        for (c, key) in cases {
            let e = validate(&c).err().unwrap_or_else(|| panic!("{c:?} passed"));
            assert!(e.0.contains(key), "{}", e.0);
        }
    }

    #[test]
    fn keys_are_camel_case_and_strict() {
        let c: ContextConfig = serde_json::from_value(
            serde_json::json!({"keepRecentMessages": 2, "condenseFanout": 3}),
        )
        .unwrap();
        assert_eq!((c.keep_recent_messages, c.condense_fanout), (2, 3));
        assert_eq!(c.leaf_max_messages, 24);
        assert!(
            serde_json::from_value::<ContextConfig>(serde_json::json!({"keepRecent": 2})).is_err()
        );
        // The whole file: the section sits under agentDefaults, and a bad range stops the start.
        let file =
            crate::config::parse("agentDefaults:\n  context: {leafMaxMessages: 6}\n").unwrap();
        assert_eq!(file.agent_defaults.context.leaf_max_messages, 6);
        let bad = crate::config::parse("agentDefaults:\n  context: {condenseFanout: 1}\n").unwrap();
        let e = crate::config::validate(&bad).err().unwrap();
        assert!(
            e.0.contains("agentDefaults.context.condenseFanout"),
            "{}",
            e.0
        );
    }
}
