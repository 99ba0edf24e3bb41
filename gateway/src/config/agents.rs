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

use crate::api::generated::types as wire;

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
    /// The agent's own heartbeat settings (over `scheduler.heartbeat`).
    #[serde(rename = "heartbeat", default, skip_serializing_if = "Option::is_none")]
    pub heartbeat: Option<HeartbeatSettings>,
    /// Administrator trust (file-only, default false): without it no run of the agent may
    /// call the autonomy control methods, nor any admin method, through `tool.invoke`
    /// (`docs/orchestration.md`). Only the configuration file's value counts.
    #[serde(
        rename = "adminTrust",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub admin_trust: Option<bool>,
}

/// One agent's heartbeat settings; an absent member takes the gateway default.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HeartbeatSettings {
    /// Whether scheduled ticks run (wakes and triggers run regardless).
    #[serde(rename = "enabled", default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Time between ticks in milliseconds.
    #[serde(
        rename = "intervalMs",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub interval_ms: Option<i64>,
    /// The message of each tick.
    #[serde(rename = "prompt", default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// The daily window in which scheduled ticks may run.
    #[serde(
        rename = "activeHours",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub active_hours: Option<ActiveHoursSettings>,
    /// Model for heartbeat turns.
    #[serde(rename = "model", default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Session key of heartbeat turns (a heartbeat session of the agent).
    #[serde(rename = "session", default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// Publish acknowledgement-only replies.
    #[serde(rename = "showOk", default, skip_serializing_if = "Option::is_none")]
    pub show_ok: Option<bool>,
    /// Publish alerts.
    #[serde(
        rename = "showAlerts",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub show_alerts: Option<bool>,
    /// Allow delivery to a direct-message conversation.
    #[serde(rename = "allowDm", default, skip_serializing_if = "Option::is_none")]
    pub allow_dm: Option<bool>,
    /// Reduced context for heartbeat turns.
    #[serde(
        rename = "lightContext",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub light_context: Option<bool>,
    /// Characters besides HEARTBEAT_OK a reply may have and still be an acknowledgement.
    #[serde(
        rename = "ackMaxChars",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub ack_max_chars: Option<i64>,
    /// Text put before every delivered message.
    #[serde(
        rename = "responsePrefix",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub response_prefix: Option<String>,
    /// Do not deliver a message that is only the acknowledgement token.
    #[serde(
        rename = "skipHeartbeatOnlyDelivery",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub skip_heartbeat_only_delivery: Option<bool>,
    /// Consecutive failed ticks that raise an alert.
    #[serde(
        rename = "alertThreshold",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub alert_threshold: Option<i64>,
    /// Minimum time between two alerts.
    #[serde(
        rename = "alertCooldownMs",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub alert_cooldown_ms: Option<i64>,
    /// Stale-heartbeat threshold (stored; 0 disables).
    #[serde(rename = "staleMs", default, skip_serializing_if = "Option::is_none")]
    pub stale_ms: Option<i64>,
    /// Delivery target: channel type.
    #[serde(
        rename = "targetChannelType",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub target_channel_type: Option<String>,
    /// Delivery target: channel id.
    #[serde(
        rename = "targetChannelId",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub target_channel_id: Option<String>,
    /// Delivery target: chat id.
    #[serde(
        rename = "targetChatId",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub target_chat_id: Option<String>,
    /// Delivery target: whether the chat is a direct message.
    #[serde(
        rename = "targetIsDm",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub target_is_dm: Option<bool>,
}

impl HeartbeatSettings {
    /// `top`'s members where set, else `self`'s. The destructuring names every member, so a
    /// member added to the struct and not here is a compile error.
    pub fn overlaid(self, top: Self) -> Self {
        macro_rules! overlay {
            ($($m:ident),*) => {{
                let Self { $($m),* } = top;
                Self { $($m: $m.or(self.$m)),* }
            }};
        }
        overlay!(
            enabled,
            interval_ms,
            prompt,
            active_hours,
            model,
            session,
            show_ok,
            show_alerts,
            allow_dm,
            light_context,
            ack_max_chars,
            response_prefix,
            skip_heartbeat_only_delivery,
            alert_threshold,
            alert_cooldown_ms,
            stale_ms,
            target_channel_type,
            target_channel_id,
            target_chat_id,
            target_is_dm
        )
    }
}

/// A daily window (`HH:MM` to `HH:MM` or `24:00`) in a time zone.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ActiveHoursSettings {
    #[serde(rename = "start")]
    pub start: String,
    #[serde(rename = "end")]
    pub end: String,
    #[serde(rename = "tz", default, skip_serializing_if = "Option::is_none")]
    pub tz: Option<String>,
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
    ("HeartbeatSettings", "HeartbeatConfig"),
    ("ActiveHoursSettings", "HeartbeatActiveHours"),
];

/// Members of a domain type whose catalogue namesake was renamed: (our definition, our
/// member, the catalogue's member). `config.schema` takes the catalogue member's schema for
/// ours; the conversions below map the Rust fields by hand. Empty while the names agree.
pub const CATALOGUE_MEMBER_RENAMES: &[(&str, &str, &str)] = &[];

/// Members of a domain type with no catalogue namesake on purpose: (our definition, our
/// member). They are file-only (`config::trust`), so no API method may carry them, and
/// `config.schema` shows their own schema.
pub const FILE_ONLY_MEMBERS: &[(&str, &str)] = &[("AgentSettings", "adminTrust")];

// The configuration file's providers and heartbeats are not checked against the catalogue's
// schemas (the API's are): their durations are checked here with the catalogue's ranges, so a
// value that loads can never overflow where it becomes a timeout or a deadline.
/// Range of a provider's `timeoutMs` (catalogue).
pub const PROVIDER_TIMEOUT_MS: std::ops::RangeInclusive<i64> = 1_000..=600_000;
/// Largest scripted `delayMs` (catalogue).
pub const MAX_SCRIPT_DELAY_MS: i64 = 600_000;
/// Range of a heartbeat's `intervalMs` (catalogue: 10 seconds to 24 hours).
pub const HEARTBEAT_INTERVAL_MS: std::ops::RangeInclusive<i64> = 10_000..=86_400_000;

fn in_range(at: &str, v: Option<i64>, r: std::ops::RangeInclusive<i64>) -> Result<(), String> {
    match v {
        Some(v) if !r.contains(&v) => Err(format!(
            "{at} must be between {} and {}, got {v}",
            r.start(),
            r.end()
        )),
        _ => Ok(()),
    }
}

/// The durations of provider `at` (`providers.<id>`) within the catalogue's ranges; the error
/// names the key.
pub fn check_provider_durations(at: &str, p: &ProviderSettings) -> Result<(), String> {
    in_range(
        &format!("{at}.timeoutMs"),
        p.timeout_ms,
        PROVIDER_TIMEOUT_MS,
    )?;
    for (i, rule) in p.script.iter().flatten().enumerate() {
        for (j, step) in rule.steps.iter().enumerate() {
            in_range(
                &format!("{at}.script[{i}].steps[{j}].delayMs"),
                step.delay_ms,
                0..=MAX_SCRIPT_DELAY_MS,
            )?;
        }
    }
    Ok(())
}

/// The durations of heartbeat settings `at` within the catalogue's ranges (cooldown and stale
/// times are only compared, never added to a clock: not negative is enough).
pub fn check_heartbeat_durations(at: &str, h: &HeartbeatSettings) -> Result<(), String> {
    in_range(
        &format!("{at}.intervalMs"),
        h.interval_ms,
        HEARTBEAT_INTERVAL_MS,
    )?;
    in_range(
        &format!("{at}.alertCooldownMs"),
        h.alert_cooldown_ms,
        0..=i64::MAX,
    )?;
    in_range(&format!("{at}.staleMs"), h.stale_ms, 0..=i64::MAX)
}

/// The catalogue's name of member `member` of our definition `def`.
pub fn catalogue_member<'a>(def: &str, member: &'a str) -> &'a str {
    CATALOGUE_MEMBER_RENAMES
        .iter()
        .find(|(d, m, _)| *d == def && *m == member)
        .map_or(member, |(_, _, theirs)| theirs)
}

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
            heartbeat,
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
            heartbeat: heartbeat.map(HeartbeatSettings::from),
            // Never set through the API (file-only).
            admin_trust: None,
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
            heartbeat,
            admin_trust: _,
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
            heartbeat: heartbeat.map(wire::HeartbeatConfig::from),
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

/// Every member of the two heartbeat types, in one list: the conversions below are written
/// once and cannot miss a member (a member added on either side fails to compile).
macro_rules! heartbeat_members {
    ($from:ident, $to:ident, $w:ident, $hours:expr) => {{
        let $from {
            enabled,
            interval_ms,
            prompt,
            active_hours,
            model,
            session,
            show_ok,
            show_alerts,
            allow_dm,
            light_context,
            ack_max_chars,
            response_prefix,
            skip_heartbeat_only_delivery,
            alert_threshold,
            alert_cooldown_ms,
            stale_ms,
            target_channel_type,
            target_channel_id,
            target_chat_id,
            target_is_dm,
        } = $w;
        $to {
            enabled,
            interval_ms,
            prompt,
            active_hours: active_hours.map($hours),
            model,
            session,
            show_ok,
            show_alerts,
            allow_dm,
            light_context,
            ack_max_chars,
            response_prefix,
            skip_heartbeat_only_delivery,
            alert_threshold,
            alert_cooldown_ms,
            stale_ms,
            target_channel_type,
            target_channel_id,
            target_chat_id,
            target_is_dm,
        }
    }};
}

impl From<wire::HeartbeatConfig> for HeartbeatSettings {
    fn from(w: wire::HeartbeatConfig) -> Self {
        use wire::HeartbeatConfig as W;
        heartbeat_members!(W, HeartbeatSettings, w, |h: wire::HeartbeatActiveHours| {
            ActiveHoursSettings {
                start: h.start,
                end: h.end,
                tz: h.tz,
            }
        })
    }
}

impl From<HeartbeatSettings> for wire::HeartbeatConfig {
    fn from(d: HeartbeatSettings) -> Self {
        use wire::HeartbeatConfig as W;
        heartbeat_members!(HeartbeatSettings, W, d, |h: ActiveHoursSettings| {
            wire::HeartbeatActiveHours {
                start: h.start,
                end: h.end,
                tz: h.tz,
            }
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    /// A fully populated scripted provider (every member, every step member) as stored in the
    /// `providers` table before the domain types existed: the text the wire type
    /// `ProvidersConfig` wrote on `main` at 779c347. Databases hold this; it must stay
    /// readable and be written the same way.
    pub(crate) const PROVIDER_JSON: &str = r#"{"type":"scripted","name":"Demo","baseUrl":"http://127.0.0.1:9/v1","apiKeyEnv":"DEMO_KEY","timeoutMs":5000,"maxRetries":1,"enabled":true,"models":["echo","other"],"script":[{"match":"time","steps":[{"reply":"It is noon.","toolCalls":[{"name":"clock","arguments":{"tz":"UTC"}}],"error":{"status":503,"message":"busy"},"failTimes":2,"delayMs":10,"usage":{"input":3,"output":4,"cached":1}}]}]}"#;

    /// A fully populated agent as stored in the `agents` table on `main` at 779c347.
    pub(crate) const AGENT_JSON: &str = r#"{"name":"Bot","provider":"demo","model":"demo/echo","systemPrompt":"Be brief.","maxSteps":4,"budget":{"tokens":1000,"costUsd":0.5},"tools":["clock"],"fallbackModels":["demo/other"],"operationModels":{"summarize":"demo/echo"}}"#;

    /// The same two entries in a configuration file.
    pub(crate) const CONFIG_YAML: &str = r#"
providers:
  demo:
    type: scripted
    name: Demo
    baseUrl: http://127.0.0.1:9/v1
    apiKeyEnv: DEMO_KEY
    timeoutMs: 5000
    maxRetries: 1
    enabled: true
    models: [echo, other]
    script:
      - match: time
        steps:
          - reply: It is noon.
            toolCalls:
              - name: clock
                arguments: {tz: UTC}
            error: {status: 503, message: busy}
            failTimes: 2
            delayMs: 10
            usage: {input: 3, output: 4, cached: 1}
agents:
  bot:
    name: Bot
    provider: demo
    model: demo/echo
    systemPrompt: Be brief.
    maxSteps: 4
    budget: {tokens: 1000, costUsd: 0.5}
    tools: [clock]
    fallbackModels: [demo/other]
    operationModels: {summarize: demo/echo}
"#;

    /// `seed_hash` of the file entries of `CONFIG_YAML`, computed with `main`'s code at
    /// 779c347 (the wire types then were the file format): a temporary test parsed
    /// `CONFIG_YAML` with `config::parse` and printed `seed_hash` of each entry. An unchanged
    /// hash means an existing database does not see the file's entries as changed (which
    /// would overwrite settings changed through the API) after this refactor.
    pub(crate) const PROVIDER_SEED_HASH: &str =
        "20c1ca0198d1b51ae5ba36cdabf0456bd6a3cc43b8a76005600d6c0f1f3cbd45";
    pub(crate) const AGENT_SEED_HASH: &str =
        "e1b1810f36fd1fd3b6e7be4e0711cd9efca2d47db94400ddbccdadae8cd4a6fe";

    pub(crate) fn full_provider() -> ProviderSettings {
        ProviderSettings {
            type_: Some(ProviderType::Scripted),
            name: Some("Demo".into()),
            base_url: Some("http://127.0.0.1:9/v1".into()),
            api_key_env: Some("DEMO_KEY".into()),
            timeout_ms: Some(5000),
            max_retries: Some(1),
            enabled: Some(true),
            models: Some(vec!["echo".into(), "other".into()]),
            script: Some(vec![ScriptRule {
                match_: Some("time".into()),
                steps: vec![ScriptStep {
                    reply: Some("It is noon.".into()),
                    tool_calls: Some(vec![ScriptToolCall {
                        name: "clock".into(),
                        arguments: Some(serde_json::json!({"tz": "UTC"})),
                    }]),
                    error: Some(ScriptFailure {
                        status: 503,
                        message: Some("busy".into()),
                    }),
                    fail_times: Some(2),
                    delay_ms: Some(10),
                    usage: Some(ScriptUsage {
                        input: 3,
                        output: 4,
                        cached: Some(1),
                    }),
                }],
            }]),
        }
    }

    pub(crate) fn full_agent() -> AgentSettings {
        AgentSettings {
            name: Some("Bot".into()),
            provider: Some("demo".into()),
            model: Some("demo/echo".into()),
            system_prompt: Some("Be brief.".into()),
            max_steps: Some(4),
            budget: Some(AgentBudget {
                tokens: Some(1000),
                cost_usd: Some(0.5),
            }),
            tools: Some(vec!["clock".into()]),
            fallback_models: Some(vec!["demo/other".into()]),
            operation_models: Some(BTreeMap::from([("summarize".into(), "demo/echo".into())])),
            // Added later, optional and skipped when absent: the stored format is unchanged.
            heartbeat: None,
            admin_trust: None,
        }
    }

    #[test]
    fn a_stored_provider_is_written_and_read_in_todays_format() {
        assert_eq!(
            serde_json::to_string(&full_provider()).unwrap(),
            PROVIDER_JSON
        );
        let read: ProviderSettings = serde_json::from_str(PROVIDER_JSON).unwrap();
        assert_eq!(read, full_provider());
    }

    #[test]
    fn a_stored_agent_is_written_and_read_in_todays_format() {
        assert_eq!(serde_json::to_string(&full_agent()).unwrap(), AGENT_JSON);
        let read: AgentSettings = serde_json::from_str(AGENT_JSON).unwrap();
        assert_eq!(read, full_agent());
    }

    #[test]
    fn absent_members_are_not_written_and_unknown_ones_are_refused() {
        assert_eq!(
            serde_json::to_string(&ProviderSettings::default()).unwrap(),
            "{}"
        );
        assert_eq!(
            serde_json::to_string(&AgentSettings::default()).unwrap(),
            "{}"
        );
        let step: ScriptStep = serde_json::from_str("{}").unwrap();
        assert_eq!(serde_json::to_string(&step).unwrap(), "{}");
        for (text, what) in [
            (r#"{"type":"local","timeout":5}"#, "provider"),
            (r#"{"script":[{"steps":[{"replies":"x"}]}]}"#, "step"),
            (r#"{"script":[{"steps":[],"matches":"x"}]}"#, "rule"),
        ] {
            let e = serde_json::from_str::<ProviderSettings>(text).unwrap_err();
            assert!(e.to_string().contains("unknown field"), "{what}: {e}");
        }
        let e = serde_json::from_str::<AgentSettings>(r#"{"budget":{"usd":1}}"#).unwrap_err();
        assert!(e.to_string().contains("unknown field `usd`"), "{e}");
        let e = serde_json::from_str::<ProviderSettings>(r#"{"type":"bedrock"}"#).unwrap_err();
        assert!(e.to_string().contains("unknown variant `bedrock`"), "{e}");
        // Required members of the scripted types stay required.
        assert!(serde_json::from_str::<ScriptRule>(r#"{"match":"x"}"#).is_err());
        assert!(serde_json::from_str::<ScriptFailure>(r#"{"message":"x"}"#).is_err());
        assert!(serde_json::from_str::<ScriptUsage>(r#"{"input":1}"#).is_err());
        assert!(serde_json::from_str::<ScriptToolCall>(r#"{"arguments":{}}"#).is_err());
    }

    #[test]
    fn domain_to_wire_to_domain_is_lossless() {
        let p = full_provider();
        assert_eq!(
            ProviderSettings::from(wire::ProvidersConfig::from(p.clone())),
            p
        );
        let a = full_agent();
        assert_eq!(AgentSettings::from(wire::AgentsConfig::from(a.clone())), a);
        for t in [
            ProviderType::Openai,
            ProviderType::Anthropic,
            ProviderType::Local,
            ProviderType::Scripted,
        ] {
            assert_eq!(ProviderType::from(wire::ProvidersType::from(t)), t);
        }
        // Every member absent survives too (None is not turned into a default).
        let empty = ProviderSettings::default();
        assert_eq!(
            ProviderSettings::from(wire::ProvidersConfig::from(empty.clone())),
            empty
        );
        let empty = AgentSettings::default();
        assert_eq!(
            AgentSettings::from(wire::AgentsConfig::from(empty.clone())),
            empty
        );
    }

    #[test]
    fn wire_to_domain_to_wire_is_lossless() {
        let w = wire::ProvidersConfig::from(full_provider());
        assert_eq!(
            wire::ProvidersConfig::from(ProviderSettings::from(w.clone())),
            w
        );
        let w = wire::AgentsConfig::from(full_agent());
        assert_eq!(wire::AgentsConfig::from(AgentSettings::from(w.clone())), w);
    }

    #[test]
    fn a_file_entry_keeps_its_seed_hash() {
        let config = crate::config::parse(CONFIG_YAML).unwrap();
        let p = &config.providers["demo"];
        assert_eq!(p, &full_provider());
        assert_eq!(crate::providers::registry::seed_hash(p), PROVIDER_SEED_HASH);
        let a = &config.agents["bot"];
        assert_eq!(a, &full_agent());
        assert_eq!(crate::providers::registry::seed_hash(a), AGENT_SEED_HASH);
    }
}
