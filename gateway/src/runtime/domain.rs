//! The engine's own settings types for agents and providers, and their conversions to and
//! from the generated wire types of the catalogue.
//!
//! These types define two formats that outlive a release: the `providers:` / `agents:`
//! entries of the configuration file and the JSON stored in the `agents` / `providers`
//! tables. Their serde attributes are written here on purpose (not derived from
//! `catalogue/types/`): renaming a member in the catalogue changes the JSON-RPC wire format
//! only, and breaks the build of the conversions below, where the rename is mapped by hand.
//!
//! **The format is frozen.** Changing a `rename` here, removing a member, or reordering
//! members (the order is the serialised order, which the seed hash of every file entry
//! covers) is a data migration: existing files and database rows would stop parsing or be
//! re-seeded. Add members at the end, optional, with `skip_serializing_if`.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::rpc::generated::types as wire;

/// The settings of an agent, as written in the configuration file and stored. Every member
/// is optional; once completed (`runtime::agents::complete`) every member is set.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentSettings {
    /// Display name; the agent id when never set.
    #[serde(rename = "name", default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Id of the provider serving the agent.
    #[serde(rename = "provider", default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// Primary model as `<provider>/<modelId>`.
    #[serde(rename = "model", default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// System prompt put in front of every turn.
    #[serde(
        rename = "systemPrompt",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub system_prompt: Option<String>,
    /// Maximum model steps (calls) per turn.
    #[serde(rename = "maxSteps", default, skip_serializing_if = "Option::is_none")]
    pub max_steps: Option<i64>,
    /// Per-turn spending limits.
    #[serde(rename = "budget", default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<AgentBudget>,
    /// Names of the tools the agent may call; `["*"]` allows every registered tool.
    #[serde(rename = "tools", default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,
    /// Models tried in order when the primary model fails.
    #[serde(
        rename = "fallbackModels",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub fallback_models: Option<Vec<String>>,
    /// Model per operation other than chat (`summarize`, `embed`).
    #[serde(
        rename = "operationModels",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub operation_models: Option<BTreeMap<String, String>>,
}

/// Per-turn spending limits of an agent; an absent member is no limit.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentBudget {
    /// Maximum input plus output tokens of one turn.
    #[serde(rename = "tokens", default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<i64>,
    /// Maximum estimated cost of one turn in USD.
    #[serde(rename = "costUsd", default, skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
}

/// The settings of a model provider, as written in the configuration file and stored. Every
/// member is optional; once completed (`runtime::providers_registry::complete`) every member
/// but `baseUrl`, `apiKeyEnv` and `script` is set.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProviderSettings {
    /// The implementation; required when the provider is created.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub type_: Option<ProviderType>,
    /// Display name; the provider id when never set.
    #[serde(rename = "name", default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// API base URL (http or https); the type's public endpoint when absent.
    #[serde(rename = "baseUrl", default, skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    /// Name of the environment variable holding the API key (never the key).
    #[serde(rename = "apiKeyEnv", default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    /// Timeout of one model call in milliseconds.
    #[serde(rename = "timeoutMs", default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<i64>,
    /// Retries of a failed call before giving up.
    #[serde(
        rename = "maxRetries",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub max_retries: Option<i64>,
    /// Whether agents may use the provider.
    #[serde(rename = "enabled", default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Model ids offered, without the provider prefix.
    #[serde(rename = "models", default, skip_serializing_if = "Option::is_none")]
    pub models: Option<Vec<String>>,
    /// Only for type scripted: the rules that decide its replies.
    #[serde(rename = "script", default, skip_serializing_if = "Option::is_none")]
    pub script: Option<Vec<ScriptRule>>,
}

/// The provider implementation: `openai` (any OpenAI-compatible endpoint), `anthropic`,
/// `local` (in-process candle models) or `scripted` (deterministic replies for tests and
/// demos). The variants carry no doc comment so that the schema is a plain `enum`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
pub enum ProviderType {
    #[serde(rename = "openai")]
    Openai,
    #[serde(rename = "anthropic")]
    Anthropic,
    #[serde(rename = "local")]
    Local,
    #[serde(rename = "scripted")]
    Scripted,
}

/// One rule of a scripted provider: the steps answering the model calls of a turn whose
/// latest user message contains `match`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ScriptRule {
    /// Text that must occur in the latest user message; absent matches every message.
    #[serde(rename = "match", default, skip_serializing_if = "Option::is_none")]
    pub match_: Option<String>,
    /// The answers of successive model calls of one turn.
    #[serde(rename = "steps")]
    pub steps: Vec<ScriptStep>,
}

/// One scripted model answer: text, tool calls, or a provider error.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ScriptStep {
    /// Answer text; empty when absent.
    #[serde(rename = "reply", default, skip_serializing_if = "Option::is_none")]
    pub reply: Option<String>,
    /// Tool calls the model asks for.
    #[serde(rename = "toolCalls", default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ScriptToolCall>>,
    /// Fail the call with this error instead of answering.
    #[serde(rename = "error", default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ScriptFailure>,
    /// With `error`: fail only this many times, then answer.
    #[serde(rename = "failTimes", default, skip_serializing_if = "Option::is_none")]
    pub fail_times: Option<i64>,
    /// Wait this long (ms) before answering.
    #[serde(rename = "delayMs", default, skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<i64>,
    /// Token counts to report; estimated from the text when absent.
    #[serde(rename = "usage", default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<ScriptUsage>,
}

/// A tool call of a scripted answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ScriptToolCall {
    /// The tool to call.
    #[serde(rename = "name")]
    pub name: String,
    /// The arguments (any JSON value; `{}` when absent).
    #[serde(rename = "arguments", default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<serde_json::Value>,
}

/// A scripted provider failure, as an HTTP status would report it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ScriptFailure {
    /// The HTTP status to imitate.
    #[serde(rename = "status")]
    pub status: i64,
    /// Error text; a generic one when absent.
    #[serde(rename = "message", default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Token counts a scripted answer reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ScriptUsage {
    /// Input tokens.
    #[serde(rename = "input")]
    pub input: i64,
    /// Output tokens.
    #[serde(rename = "output")]
    pub output: i64,
    /// Input tokens served from the prompt cache.
    #[serde(rename = "cached", default, skip_serializing_if = "Option::is_none")]
    pub cached: Option<i64>,
}

/// Each domain type's JSON Schema definition name (as schemars names it in the
/// configuration schema) and the catalogue type it converts to, for `config.schema`, which
/// copies the catalogue's constraints onto the members whose names agree.
pub const CATALOGUE_TYPES: &[(&str, &str)] = &[
    ("AgentSettings", "AgentsConfig"),
    ("AgentBudget", "AgentsBudget"),
    ("ProviderSettings", "ProvidersConfig"),
    ("ProviderType", "ProvidersType"),
    ("ScriptRule", "ScriptedRule"),
    ("ScriptStep", "ScriptedStep"),
    ("ScriptToolCall", "ScriptedToolCall"),
    ("ScriptFailure", "ScriptedError"),
    ("ScriptUsage", "ScriptedUsage"),
];

// The conversions destructure every struct in full (no `..`), so a member added, removed or
// renamed in the catalogue is a compile error here rather than a silent format change.

fn map_vec<A, B: From<A>>(v: Option<Vec<A>>) -> Option<Vec<B>> {
    v.map(|v| v.into_iter().map(B::from).collect())
}

impl From<wire::AgentsConfig> for AgentSettings {
    fn from(w: wire::AgentsConfig) -> Self {
        let wire::AgentsConfig {
            name,
            provider,
            model,
            system_prompt,
            max_steps,
            budget,
            tools,
            fallback_models,
            operation_models,
        } = w;
        Self {
            name,
            provider,
            model,
            system_prompt,
            max_steps,
            budget: budget.map(AgentBudget::from),
            tools,
            fallback_models,
            operation_models,
        }
    }
}

impl From<AgentSettings> for wire::AgentsConfig {
    fn from(d: AgentSettings) -> Self {
        let AgentSettings {
            name,
            provider,
            model,
            system_prompt,
            max_steps,
            budget,
            tools,
            fallback_models,
            operation_models,
        } = d;
        Self {
            name,
            provider,
            model,
            system_prompt,
            max_steps,
            budget: budget.map(wire::AgentsBudget::from),
            tools,
            fallback_models,
            operation_models,
        }
    }
}

impl From<wire::AgentsBudget> for AgentBudget {
    fn from(w: wire::AgentsBudget) -> Self {
        let wire::AgentsBudget { tokens, cost_usd } = w;
        Self { tokens, cost_usd }
    }
}

impl From<AgentBudget> for wire::AgentsBudget {
    fn from(d: AgentBudget) -> Self {
        let AgentBudget { tokens, cost_usd } = d;
        Self { tokens, cost_usd }
    }
}

impl From<wire::ProvidersConfig> for ProviderSettings {
    fn from(w: wire::ProvidersConfig) -> Self {
        let wire::ProvidersConfig {
            type_,
            name,
            base_url,
            api_key_env,
            timeout_ms,
            max_retries,
            enabled,
            models,
            script,
        } = w;
        Self {
            type_: type_.map(ProviderType::from),
            name,
            base_url,
            api_key_env,
            timeout_ms,
            max_retries,
            enabled,
            models,
            script: map_vec(script),
        }
    }
}

impl From<ProviderSettings> for wire::ProvidersConfig {
    fn from(d: ProviderSettings) -> Self {
        let ProviderSettings {
            type_,
            name,
            base_url,
            api_key_env,
            timeout_ms,
            max_retries,
            enabled,
            models,
            script,
        } = d;
        Self {
            type_: type_.map(wire::ProvidersType::from),
            name,
            base_url,
            api_key_env,
            timeout_ms,
            max_retries,
            enabled,
            models,
            script: map_vec(script),
        }
    }
}

impl From<wire::ProvidersType> for ProviderType {
    fn from(w: wire::ProvidersType) -> Self {
        match w {
            wire::ProvidersType::Openai => Self::Openai,
            wire::ProvidersType::Anthropic => Self::Anthropic,
            wire::ProvidersType::Local => Self::Local,
            wire::ProvidersType::Scripted => Self::Scripted,
        }
    }
}

impl From<ProviderType> for wire::ProvidersType {
    fn from(d: ProviderType) -> Self {
        match d {
            ProviderType::Openai => Self::Openai,
            ProviderType::Anthropic => Self::Anthropic,
            ProviderType::Local => Self::Local,
            ProviderType::Scripted => Self::Scripted,
        }
    }
}

impl From<wire::ScriptedRule> for ScriptRule {
    fn from(w: wire::ScriptedRule) -> Self {
        let wire::ScriptedRule { match_, steps } = w;
        Self {
            match_,
            steps: steps.into_iter().map(ScriptStep::from).collect(),
        }
    }
}

impl From<ScriptRule> for wire::ScriptedRule {
    fn from(d: ScriptRule) -> Self {
        let ScriptRule { match_, steps } = d;
        Self {
            match_,
            steps: steps.into_iter().map(wire::ScriptedStep::from).collect(),
        }
    }
}

impl From<wire::ScriptedStep> for ScriptStep {
    fn from(w: wire::ScriptedStep) -> Self {
        let wire::ScriptedStep {
            reply,
            tool_calls,
            error,
            fail_times,
            delay_ms,
            usage,
        } = w;
        Self {
            reply,
            tool_calls: map_vec(tool_calls),
            error: error.map(ScriptFailure::from),
            fail_times,
            delay_ms,
            usage: usage.map(ScriptUsage::from),
        }
    }
}

impl From<ScriptStep> for wire::ScriptedStep {
    fn from(d: ScriptStep) -> Self {
        let ScriptStep {
            reply,
            tool_calls,
            error,
            fail_times,
            delay_ms,
            usage,
        } = d;
        Self {
            reply,
            tool_calls: map_vec(tool_calls),
            error: error.map(wire::ScriptedError::from),
            fail_times,
            delay_ms,
            usage: usage.map(wire::ScriptedUsage::from),
        }
    }
}

impl From<wire::ScriptedToolCall> for ScriptToolCall {
    fn from(w: wire::ScriptedToolCall) -> Self {
        let wire::ScriptedToolCall { name, arguments } = w;
        Self { name, arguments }
    }
}

impl From<ScriptToolCall> for wire::ScriptedToolCall {
    fn from(d: ScriptToolCall) -> Self {
        let ScriptToolCall { name, arguments } = d;
        Self { name, arguments }
    }
}

impl From<wire::ScriptedError> for ScriptFailure {
    fn from(w: wire::ScriptedError) -> Self {
        let wire::ScriptedError { status, message } = w;
        Self { status, message }
    }
}

impl From<ScriptFailure> for wire::ScriptedError {
    fn from(d: ScriptFailure) -> Self {
        let ScriptFailure { status, message } = d;
        Self { status, message }
    }
}

impl From<wire::ScriptedUsage> for ScriptUsage {
    fn from(w: wire::ScriptedUsage) -> Self {
        let wire::ScriptedUsage {
            input,
            output,
            cached,
        } = w;
        Self {
            input,
            output,
            cached,
        }
    }
}

impl From<ScriptUsage> for wire::ScriptedUsage {
    fn from(d: ScriptUsage) -> Self {
        let ScriptUsage {
            input,
            output,
            cached,
        } = d;
        Self {
            input,
            output,
            cached,
        }
    }
}
