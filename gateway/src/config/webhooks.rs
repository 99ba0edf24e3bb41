//! `webhooks.*` in the configuration file: the spec's "Webhook mapping entry" and "HMAC
//! verifier settings", the built-in presets, and the rules serde cannot express.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{ConfigError, MIN_SECRET_LEN};

/// The hash behind the HMAC; the sender and the gateway must agree on it.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Algorithm {
    /// HMAC-SHA-256: what GitHub and most senders use.
    #[default]
    Sha256,
    /// HMAC-SHA-384.
    Sha384,
    /// HMAC-SHA-512.
    Sha512,
}

impl Algorithm {
    /// The name used in configuration and in a `<algorithm>=` signature prefix.
    pub fn as_str(self) -> &'static str {
        match self {
            Algorithm::Sha256 => "sha256",
            Algorithm::Sha384 => "sha384",
            Algorithm::Sha512 => "sha512",
        }
    }

    /// Hex digest length: a signature of any other length is refused before hashing anything.
    pub fn hex_len(self) -> usize {
        match self {
            Algorithm::Sha256 => 64,
            Algorithm::Sha384 => 96,
            Algorithm::Sha512 => 128,
        }
    }
}

/// Paths the webhook base path may not take (they belong to other routes).
const RESERVED: &[&str] = &[
    "api",
    "app",
    "docs",
    "health",
    "media",
    "openapi.json",
    "openrpc.json",
    "rpc",
    "v1",
    "ws",
];

/// A secret: written inline, or read from an environment variable (`{env: NAME}`).
#[derive(Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum Secret {
    Inline(String),
    Env { env: String },
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Inline(_) => f.write_str("Secret([REDACTED])"),
            Self::Env { env } => write!(f, "Secret(env {env})"),
        }
    }
}

impl Secret {
    /// The value; an unset environment variable is an error naming it.
    pub fn resolve(&self, key: &str) -> Result<String, ConfigError> {
        match self {
            Self::Inline(s) => Ok(s.clone()),
            Self::Env { env } => std::env::var(env).map_err(|_| {
                ConfigError(format!("{key}: the environment variable {env} is not set"))
            }),
        }
    }
}

/// Largest `webhooks.hmac.maxAgeSec`: 24 hours.
pub const MAX_AGE_SEC: u64 = 86_400;
/// Largest `webhooks.mappings[].timeoutSeconds`: 24 hours.
pub const MAX_TIMEOUT_SECONDS: u64 = 86_400;

/// `webhooks`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct WebhooksConfig {
    /// Serves the webhook routes.
    pub enabled: bool,
    /// Base path of the webhook routes.
    pub path: String,
    /// Shared secret of the mapped endpoints (at least 32 characters); when set, every mapped
    /// request must be signed. Also the strict endpoint's secret unless `hmac.secret` is set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<Secret>,
    /// Largest mapped webhook body, in bytes.
    pub max_body_bytes: u64,
    /// Built-in mappings to load by name (`github`, `gmail`); unknown names are ignored.
    pub presets: Vec<String>,
    /// Mappings, evaluated in order (first match wins), before the presets.
    pub mappings: Vec<MappingConfig>,
    /// How signatures are checked.
    pub hmac: HmacConfig,
    /// Webhook agent runs allowed at once; further runs wait in the queue.
    pub max_concurrent_runs: usize,
    /// Runs waiting beyond the running ones; a full queue answers 503.
    pub max_queued_runs: usize,
}

impl Default for WebhooksConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            path: "/hooks".to_owned(),
            token: None,
            max_body_bytes: 262_144,
            presets: Vec::new(),
            mappings: Vec::new(),
            hmac: HmacConfig::default(),
            max_concurrent_runs: 4,
            max_queued_runs: 256,
        }
    }
}

/// `webhooks.hmac`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct HmacConfig {
    /// Shared secret (at least 32 characters); defaults to `webhooks.token`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<Secret>,
    /// Header carrying the hex signature (an `<algorithm>=` prefix is accepted).
    pub header_name: String,
    pub algorithm: Algorithm,
    /// Header carrying the Unix time (seconds) the sender signed at.
    pub timestamp_header_name: String,
    /// Largest difference between that time and ours, either direction (at most 24 hours).
    #[schemars(range(max = MAX_AGE_SEC))]
    pub max_age_sec: u64,
    /// Refuse requests without the timestamp header.
    pub require_timestamp: bool,
}

impl Default for HmacConfig {
    fn default() -> Self {
        Self {
            secret: None,
            header_name: "x-webhook-signature".to_owned(),
            algorithm: Algorithm::Sha256,
            timestamp_header_name: "x-webhook-timestamp".to_owned(),
            max_age_sec: 300,
            require_timestamp: false,
        }
    }
}

/// `webhooks.mappings[]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MappingConfig {
    /// Unique mapping id (also the namespace of its session keys).
    pub id: String,
    /// Match conditions; none matches every request.
    #[serde(rename = "match", default, skip_serializing_if = "Option::is_none")]
    pub matches: Option<MatchConfig>,
    #[serde(default)]
    pub action: Action,
    /// Only for `wake`.
    #[serde(default)]
    pub wake_mode: WakeMode,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Target agent (default: the default agent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    /// Session key template (namespaced by the mapping id; default: one session per request).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_key: Option<String>,
    /// Agent message template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_template: Option<String>,
    /// Plain text template, used when there is no `messageTemplate` (and by `wake`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text_template: Option<String>,
    /// Deliver the answer to a channel (stored with the run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deliver: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// Model override (`<provider>/<modelId>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Agent execution timeout in seconds (default 300; at most 24 hours).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = MAX_TIMEOUT_SECONDS))]
    pub timeout_seconds: Option<u64>,
}

/// `match`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MatchConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Equal to the payload's `source` field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    Wake,
    #[default]
    Agent,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum WakeMode {
    #[default]
    Now,
    NextHeartbeat,
}

impl Action {
    /// The configuration spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Wake => "wake",
            Self::Agent => "agent",
        }
    }
}

impl WakeMode {
    /// The configuration spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Now => "now",
            Self::NextHeartbeat => "next-heartbeat",
        }
    }
}

/// The default timeout of a webhook agent run.
pub const DEFAULT_TIMEOUT_SECS: u64 = 300;

/// A mapping of nothing but the given fields (the rest at their defaults).
fn preset(id: &str, session_key: &str, message: &str) -> MappingConfig {
    MappingConfig {
        id: id.to_owned(),
        matches: Some(MatchConfig {
            path: Some(id.to_owned()),
            source: None,
        }),
        action: Action::Agent,
        wake_mode: WakeMode::Now,
        name: None,
        agent_id: None,
        session_key: Some(session_key.to_owned()),
        message_template: Some(message.to_owned()),
        text_template: None,
        deliver: None,
        channel: None,
        to: None,
        model: None,
        timeout_seconds: None,
    }
}

/// A built-in mapping by name.
pub fn builtin_preset(name: &str) -> Option<MappingConfig> {
    match name {
        // A GitHub repository webhook: one session per delivery.
        "github" => Some(MappingConfig {
            name: Some("GitHub repository events".to_owned()),
            ..preset(
                "github",
                "{{headers.x-github-delivery}}",
                "GitHub event '{{headers.x-github-event}}' on {{payload.repository.full_name}}: \
                 action '{{payload.action}}' by {{payload.sender.login}}.",
            )
        }),
        // Gmail-style push: `{messages: [{id, from, subject, snippet, body}]}`.
        "gmail" => Some(MappingConfig {
            name: Some("Gmail messages".to_owned()),
            ..preset(
                "gmail",
                "{{payload.messages[0].id}}",
                "New email from {{payload.messages[0].from}}\nSubject: \
                 {{payload.messages[0].subject}}\n{{payload.messages[0].snippet}}\n\n\
                 {{payload.messages[0].body}}",
            )
        }),
        _ => None,
    }
}

/// Stripped of leading and trailing slashes and lowercased (the spec's rule 1).
pub fn normalize(path: &str) -> String {
    path.trim_matches('/').to_lowercase()
}

/// Every mapping in force: the configured ones, then each named preset unless a configured
/// mapping already takes its path.
pub fn effective_mappings(c: &WebhooksConfig) -> Vec<MappingConfig> {
    let mut out = c.mappings.clone();
    for name in &c.presets {
        let Some(p) = builtin_preset(name) else {
            continue;
        };
        let taken = out.iter().any(|m| {
            m.id == p.id
                || m.matches
                    .as_ref()
                    .and_then(|x| x.path.as_deref())
                    .is_some_and(|path| normalize(path) == p.id)
        });
        if !taken {
            out.push(p);
        }
    }
    out
}

/// Rules serde cannot express.
pub fn validate(c: &WebhooksConfig) -> Result<(), ConfigError> {
    let base = normalize(&c.path);
    if !c.path.starts_with('/') || base.is_empty() {
        return Err(ConfigError(
            "webhooks.path must start with '/' and name a path below it (e.g. /hooks)".to_owned(),
        ));
    }
    if !base
        .chars()
        .all(|ch| ch.is_ascii_alphanumeric() || matches!(ch, '/' | '-' | '_' | '.'))
    {
        return Err(ConfigError(
            "webhooks.path may contain only letters, digits, '/', '-', '_' and '.'".to_owned(),
        ));
    }
    let first = base.split('/').next().unwrap_or_default();
    if RESERVED.contains(&first) {
        return Err(ConfigError(format!(
            "webhooks.path '{}' collides with the gateway's /{first} routes",
            c.path
        )));
    }
    if c.max_body_bytes == 0 || c.max_concurrent_runs == 0 {
        return Err(ConfigError(
            "webhooks.maxBodyBytes and webhooks.maxConcurrentRuns must be greater than 0"
                .to_owned(),
        ));
    }
    for (key, secret) in [
        ("webhooks.token", &c.token),
        ("webhooks.hmac.secret", &c.hmac.secret),
    ] {
        if let Some(s) = secret {
            let value = s.resolve(key)?;
            if value.chars().count() < MIN_SECRET_LEN {
                return Err(ConfigError(format!(
                    "{key} is shorter than {MIN_SECRET_LEN} characters"
                )));
            }
        }
    }
    for (key, name) in [
        ("webhooks.hmac.headerName", &c.hmac.header_name),
        (
            "webhooks.hmac.timestampHeaderName",
            &c.hmac.timestamp_header_name,
        ),
    ] {
        if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
            return Err(ConfigError(format!("{key} '{name}' is not a header name")));
        }
    }
    super::at_most("webhooks.hmac.maxAgeSec", c.hmac.max_age_sec, MAX_AGE_SEC)?;
    let mut ids = std::collections::BTreeSet::new();
    for (i, m) in c.mappings.iter().enumerate() {
        let at = format!("webhooks.mappings[{i}]");
        if let Some(t) = m.timeout_seconds {
            super::at_most(&format!("{at}.timeoutSeconds"), t, MAX_TIMEOUT_SECONDS)?;
        }
        if m.id.trim().is_empty() {
            return Err(ConfigError(format!("{at}.id must not be empty")));
        }
        if !ids.insert(m.id.as_str()) {
            return Err(ConfigError(format!("{at}.id '{}' repeats", m.id)));
        }
        if m.timeout_seconds == Some(0) {
            return Err(ConfigError(format!(
                "{at}.timeoutSeconds must be a positive integer"
            )));
        }
        if m.deliver == Some(true) && m.channel.as_deref().is_none_or(|s| s.trim().is_empty()) {
            return Err(ConfigError(format!(
                "{at}: deliver is true but no channel is named"
            )));
        }
        for (field, v) in [("channel", &m.channel), ("to", &m.to), ("model", &m.model)] {
            if v.as_deref().is_some_and(|s| s.trim().is_empty()) {
                return Err(ConfigError(format!("{at}.{field} must not be empty")));
            }
        }
        if m.action == Action::Agent && m.message_template.is_none() && m.text_template.is_none() {
            return Err(ConfigError(format!(
                "{at}: action agent needs a messageTemplate or a textTemplate"
            )));
        }
    }
    Ok(())
}
