//! Gateway configuration: YAML keys and defaults of the spec's "Gateway configuration keys"
//! table (plus our documented additions), strict (unknown keys are refused with their path),
//! environment overrides, validation, and secret redaction.

pub mod agents;
pub mod autonomy;
pub mod context;
pub mod document;
pub mod engine;
pub mod graphs;
pub mod memory;
pub mod net;
pub mod provider_policy;
pub mod scheduler;
pub mod secrets;
pub mod store;
pub mod trust;
pub mod webhooks;
pub mod workspaces;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::config::agents::{AgentSettings, ProviderSettings};
use crate::config::engine::{AgentDefaults, LocalConfig, ModelConfig};

/// Environment variable naming the configuration file (same as `--config`).
pub const ENV_CONFIG: &str = "AGENT_GATEWAY_CONFIG";
/// Environment override of `gateway.port`.
pub const ENV_PORT: &str = "AGENT_GATEWAY_PORT";
/// Environment override of `gateway.host`.
pub const ENV_HOST: &str = "AGENT_GATEWAY_HOST";
/// Environment override of `gateway.dataDir`.
pub const ENV_DATA_DIR: &str = "AGENT_GATEWAY_DATA_DIR";

/// Minimum length of every secret (gateway tokens, webhook token).
pub const MIN_SECRET_LEN: usize = 32;
/// What redacted values read as.
pub const REDACTED: &str = "[REDACTED]";

// Caps of the configuration's durations. Each is far below what a clock or timer can hold (a
// `tokio::time::Instant` plus 24 hours never overflows), so a value that loads can never panic
// where it becomes a deadline; a larger one is refused at load naming its key.
/// 24 hours in ms: heartbeats, keep-alives, rate windows, body reads.
pub const MAX_DAY_MS: u64 = 86_400_000;
/// 1 hour in ms: header reads, shutdown grace.
pub const MAX_HOUR_MS: u64 = 3_600_000;
/// A year: retention of the observability rows.
pub const MAX_RETENTION_HOURS: u32 = 8_760;
/// A day: sweep intervals.
pub const MAX_SWEEP_SECONDS: u64 = 86_400;
/// 10 years: the media time to live.
pub const MAX_MEDIA_TTL_SECONDS: u64 = 315_360_000;

/// `key` (a duration) is at most `max`; the error names the key and the cap.
pub(crate) fn at_most(key: &str, v: u64, max: u64) -> Result<(), ConfigError> {
    if v > max {
        return Err(ConfigError(format!("{key} must be at most {max}, got {v}")));
    }
    Ok(())
}

/// Every duration of the `gateway`, `media` and `observability` sections within its cap.
fn durations(config: &Config) -> Result<(), ConfigError> {
    let g = &config.gateway;
    let o = &config.observability;
    let media = &config.media;
    for (key, v, max) in [
        ("gateway.wsHeartbeatMs", g.ws_heartbeat_ms, MAX_DAY_MS),
        (
            "gateway.web.sseKeepAliveMs",
            g.web.sse_keep_alive_ms,
            MAX_DAY_MS,
        ),
        (
            "gateway.rateLimit.windowMs",
            g.rate_limit.window_ms,
            MAX_DAY_MS,
        ),
        (
            "gateway.wsMessageRateLimit.windowMs",
            g.ws_message_rate_limit.window_ms,
            MAX_DAY_MS,
        ),
        (
            "gateway.headerReadTimeoutMs",
            g.header_read_timeout_ms,
            MAX_HOUR_MS,
        ),
        (
            "gateway.bodyReadTimeoutMs",
            g.body_read_timeout_ms,
            MAX_DAY_MS,
        ),
        ("gateway.shutdownGraceMs", g.shutdown_grace_ms, MAX_HOUR_MS),
        ("media.ttlSeconds", media.ttl_seconds, MAX_MEDIA_TTL_SECONDS),
        (
            "media.sweepIntervalSeconds",
            media.sweep_interval_seconds,
            MAX_SWEEP_SECONDS,
        ),
        (
            "observability.traceRetentionHours",
            u64::from(o.trace_retention_hours),
            u64::from(MAX_RETENTION_HOURS),
        ),
        (
            "observability.diagnosticsRetentionHours",
            u64::from(o.diagnostics_retention_hours),
            u64::from(MAX_RETENTION_HOURS),
        ),
        (
            "observability.sweepIntervalSeconds",
            o.sweep_interval_seconds,
            MAX_SWEEP_SECONDS,
        ),
    ] {
        at_most(key, v, max)?;
    }
    for (id, p) in &config.providers {
        crate::config::agents::check_provider_durations(&format!("providers.{id}"), p)
            .map_err(ConfigError)?;
    }
    for (id, a) in &config.agents {
        if let Some(h) = &a.heartbeat {
            crate::config::agents::check_heartbeat_durations(&format!("agents.{id}.heartbeat"), h)
                .map_err(ConfigError)?;
        }
    }
    crate::config::agents::check_heartbeat_durations(
        "scheduler.heartbeat",
        &config.scheduler.heartbeat,
    )
    .map_err(ConfigError)
}

/// The whole configuration file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Config {
    /// The HTTP/WebSocket server.
    #[serde(default)]
    pub gateway: GatewayConfig,
    /// In-process models (the `local` provider).
    #[serde(default)]
    pub local: LocalConfig,
    /// Model providers by id. When none is configured, a `local` provider is defined.
    #[serde(default)]
    pub providers: BTreeMap<String, ProviderSettings>,
    /// Model catalogue entries added or overridden.
    #[serde(default)]
    pub models: Vec<ModelConfig>,
    /// Agents by id. When none is configured, an agent `default` is defined on the first chat
    /// model.
    #[serde(default)]
    pub agents: BTreeMap<String, AgentSettings>,
    /// The agent serving calls that name none: this id, else `default`, else the first agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_agent: Option<String>,
    /// Settings every agent shares.
    #[serde(default)]
    pub agent_defaults: AgentDefaults,
    /// Limits on provider settings made through the API (`apiKeyEnv`, `baseUrl`).
    #[serde(default)]
    pub provider_policy: provider_policy::ProviderPolicyConfig,
    /// Webhook ingestion under `webhooks.path`.
    #[serde(default)]
    pub webhooks: webhooks::WebhooksConfig,
    /// Files saved by agents and tools, served under /media/.
    #[serde(default)]
    pub media: MediaConfig,
    /// The database: embedded SQLite (default) or a shared PostgreSQL.
    #[serde(default)]
    pub store: store::StoreConfig,
    /// Cron jobs declared by the operator, the timer, and heartbeat defaults.
    #[serde(default)]
    pub scheduler: scheduler::SchedulerConfig,
    /// The secret store's master key file (`AGENT_GATEWAY_MASTER_KEY` also sets the key).
    #[serde(default)]
    pub secrets: secrets::SecretsConfig,
    /// The history of configuration changes made through the API.
    #[serde(default)]
    pub config_history: ConfigHistoryConfig,
    /// Retention of the session index, diagnostics and prompt reports (`obs.*`).
    #[serde(default)]
    pub observability: ObservabilityConfig,
    /// Long-term memory: embeddings, recall and consolidation (`memory.*`).
    #[serde(default)]
    pub memory: memory::MemoryConfig,
    /// Run trees agents build themselves: sub-agent limits and the denial breaker
    /// (`docs/orchestration.md`).
    #[serde(default)]
    pub autonomy: autonomy::AutonomyConfig,
    /// Graph workflows: default timeouts and per-owner limits (`docs/graphs.md`).
    #[serde(default)]
    pub graphs: graphs::GraphsConfig,
    /// What the workspace methods never reach (`docs/workspaces.md`).
    #[serde(default)]
    pub workspaces: workspaces::WorkspacesConfig,
    /// What the gateway's own outbound fetches may reach, and their limits (`docs/net.md`).
    #[serde(default)]
    pub net: net::NetConfig,
}

/// `observability`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct ObservabilityConfig {
    /// Hours the session index (`obs.trace.*`, `obs.fleet.health`, breaker timelines in
    /// `obs.explain`) keeps its rows; the spec's two days by default (at most a year).
    #[schemars(range(max = MAX_RETENTION_HOURS))]
    pub trace_retention_hours: u32,
    /// Hours diagnostic events (`obs.diagnostics`) are kept (at most a year).
    #[schemars(range(max = MAX_RETENTION_HOURS))]
    pub diagnostics_retention_hours: u32,
    /// System prompt reports kept per session (the newest).
    pub prompt_reports_per_session: u32,
    /// How often expired rows are swept, in seconds (at most a day).
    #[schemars(range(max = MAX_SWEEP_SECONDS))]
    pub sweep_interval_seconds: u64,
}

impl Default for ObservabilityConfig {
    fn default() -> Self {
        Self {
            trace_retention_hours: 48,
            diagnostics_retention_hours: 168,
            prompt_reports_per_session: 20,
            sweep_interval_seconds: 600,
        }
    }
}

/// `configHistory`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct ConfigHistoryConfig {
    /// `config.gc` keeps this many newest commits and drops the older ones.
    pub keep: u32,
}

impl Default for ConfigHistoryConfig {
    fn default() -> Self {
        Self { keep: 100 }
    }
}

/// `media`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct MediaConfig {
    /// A file older than this is expired (410) and then swept; 0 keeps files forever (at
    /// most 10 years).
    #[schemars(range(max = MAX_MEDIA_TTL_SECONDS))]
    pub ttl_seconds: u64,
    /// Largest file the store accepts, in bytes.
    pub max_file_bytes: u64,
    /// How often expired files are swept, in seconds (at most a day).
    #[schemars(range(max = MAX_SWEEP_SECONDS))]
    pub sweep_interval_seconds: u64,
}

impl Default for MediaConfig {
    fn default() -> Self {
        Self {
            ttl_seconds: 7 * 24 * 3600,
            max_file_bytes: 25 * 1024 * 1024,
            sweep_interval_seconds: 3600,
        }
    }
}

/// `gateway.*`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct GatewayConfig {
    /// Enables the gateway server.
    pub enabled: bool,
    /// Bind address (loopback by default).
    pub host: String,
    /// Listen port.
    pub port: u16,
    /// Where the gateway keeps its data; created on first run. Default: the user data
    /// directory (`$XDG_DATA_HOME/agent-gateway`, `~/.local/share/agent-gateway`).
    pub data_dir: Option<PathBuf>,
    /// Bearer tokens. When empty, a local token is created in the data directory.
    pub tokens: Vec<TokenConfig>,
    /// Global HTTP rate limit (per client address).
    pub rate_limit: RateLimitConfig,
    /// Maximum POST body in bytes.
    pub http_body_limit_bytes: u64,
    /// Maximum JSON-RPC batch length.
    pub max_batch_size: usize,
    /// WebSocket heartbeat interval in ms; 0 disables (at most 24 hours).
    #[schemars(range(max = MAX_DAY_MS))]
    pub ws_heartbeat_ms: u64,
    /// Per-connection WebSocket message rate (sliding window).
    pub ws_message_rate_limit: WsRateConfig,
    /// Maximum WebSocket message size, in characters, checked before JSON parsing.
    pub ws_max_message_bytes: usize,
    /// REST API and dashboard.
    pub web: WebConfig,
    /// TLS settings.
    pub tls: TlsConfig,
    /// Browser origins allowed to open /ws besides the gateway's own.
    pub allowed_origins: Vec<String>,
    /// API documentation (/docs, /openapi.json).
    pub docs: DocsConfig,
    /// A client must finish sending request headers within this many ms (at most 1 hour).
    #[schemars(range(max = MAX_HOUR_MS))]
    pub header_read_timeout_ms: u64,
    /// A client must finish sending a request body within this many ms (at most 24 hours).
    #[schemars(range(max = MAX_DAY_MS))]
    pub body_read_timeout_ms: u64,
    /// On shutdown or restart, how long open connections get to close, in ms (at most 1
    /// hour).
    #[schemars(range(max = MAX_HOUR_MS))]
    pub shutdown_grace_ms: u64,
    /// Peers (IP addresses or CIDR blocks) whose `Forwarded` / `X-Forwarded-For` headers name
    /// the client; from any other peer those headers are ignored.
    pub trusted_proxies: Vec<String>,
    /// Concurrent turns and background runs.
    pub limits: LimitsConfig,
    /// Open connections (HTTP and upgraded WebSockets) at most; past it a connection gets a
    /// 503 and is closed.
    pub max_connections: usize,
}

/// `gateway.limits`: how many turns and background runs may run at once.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct LimitsConfig {
    /// Per client id (token), across every surface.
    pub max_concurrent_turns_per_client: u32,
    /// For the whole gateway.
    pub max_concurrent_turns: u32,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            max_concurrent_turns_per_client: 8,
            max_concurrent_turns: 64,
        }
    }
}

impl Default for GatewayConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            host: "127.0.0.1".to_owned(),
            port: 4766,
            data_dir: None,
            tokens: Vec::new(),
            rate_limit: RateLimitConfig::default(),
            http_body_limit_bytes: 1_048_576,
            max_batch_size: 50,
            ws_heartbeat_ms: 30_000,
            ws_message_rate_limit: WsRateConfig::default(),
            ws_max_message_bytes: 1_048_576,
            web: WebConfig::default(),
            tls: TlsConfig::default(),
            allowed_origins: Vec::new(),
            docs: DocsConfig::default(),
            header_read_timeout_ms: 10_000,
            body_read_timeout_ms: 30_000,
            shutdown_grace_ms: 5_000,
            trusted_proxies: Vec::new(),
            limits: LimitsConfig::default(),
            max_connections: 16_384,
        }
    }
}

/// `gateway.tokens[]`.
#[derive(Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TokenConfig {
    /// Token/client identifier.
    pub id: String,
    /// The secret, at least 32 characters.
    pub secret: String,
    /// Scopes (rpc, admin, *, api, mcp-client, metrics); empty means all scopes.
    #[serde(default)]
    pub scopes: Vec<String>,
}

impl std::fmt::Debug for TokenConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenConfig")
            .field("id", &self.id)
            .field("secret", &REDACTED)
            .field("scopes", &self.scopes)
            .finish()
    }
}

/// `gateway.rateLimit`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct RateLimitConfig {
    /// Window length in ms (at most 24 hours).
    #[schemars(range(max = MAX_DAY_MS))]
    pub window_ms: u64,
    /// Requests per window.
    pub max_requests: u64,
}

impl Default for RateLimitConfig {
    fn default() -> Self {
        Self {
            window_ms: 60_000,
            max_requests: 100,
        }
    }
}

/// `gateway.wsMessageRateLimit`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct WsRateConfig {
    /// Messages per window per connection.
    pub max_messages: usize,
    /// Window length in ms (at most 24 hours).
    #[schemars(range(max = MAX_DAY_MS))]
    pub window_ms: u64,
}

impl Default for WsRateConfig {
    fn default() -> Self {
        Self {
            max_messages: 60,
            window_ms: 60_000,
        }
    }
}

/// `gateway.web`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct WebConfig {
    /// Enables the REST API and dashboard.
    pub enabled: bool,
    /// The dashboard's built files, served under /app/ (none: /app/ is not served).
    pub dist_dir: Option<PathBuf>,
    /// Keep-alive comment interval on /api/events (the spec's 15 seconds by default; at most
    /// 24 hours).
    #[schemars(range(max = MAX_DAY_MS))]
    pub sse_keep_alive_ms: u64,
}

impl Default for WebConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            dist_dir: None,
            sse_keep_alive_ms: 15_000,
        }
    }
}

/// `gateway.tls`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct TlsConfig {
    /// Requires a client certificate signed by the configured CA.
    pub require_client_cert: Option<bool>,
}

/// `gateway.docs`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct DocsConfig {
    /// Serves /docs and /openapi.json (without a token).
    pub enabled: bool,
}

impl Default for DocsConfig {
    fn default() -> Self {
        Self { enabled: true }
    }
}

/// A configuration that cannot be used; the message says what and where.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

/// The configuration in force and where it came from.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub config: Config,
    /// Files read, in order (empty on embedded defaults).
    pub paths: Vec<PathBuf>,
}

/// YAML 1.2 core booleans only (`on`/`off`/`yes`/`no` are strings, never silently booleans).
pub(crate) fn yaml_options() -> serde_saphyr::Options {
    let mut o = serde_saphyr::Options::default();
    o.strict_booleans = true;
    o
}

/// Parses YAML text; unknown keys and bad values are refused with their path.
pub fn parse(text: &str) -> Result<Config, ConfigError> {
    let value: Value = if text.trim().is_empty() {
        Value::Object(serde_json::Map::new())
    } else {
        serde_saphyr::from_str_with_options(text, yaml_options())
            .map_err(|e| ConfigError(format!("invalid YAML: {e}")))?
    };
    let value = match value {
        Value::Null => Value::Object(serde_json::Map::new()),
        v => v,
    };
    from_value(value)
}

/// Decodes a JSON value into a configuration, naming the path of the first bad key.
pub fn from_value(value: Value) -> Result<Config, ConfigError> {
    serde_path_to_error::deserialize::<_, Config>(value).map_err(|e| {
        let path = e.path().to_string();
        ConfigError(format!("configuration key '{path}': {}", e.into_inner()))
    })
}

/// The file the gateway reads when none is named: `<dataDir>/config.yaml` (where configuration
/// writes go when the gateway started without a file), when it exists.
fn default_file() -> Option<PathBuf> {
    let mut defaults = Config::default();
    apply_env(&mut defaults).ok()?;
    let file = data_dir(&defaults).join("config.yaml");
    file.is_file().then_some(file)
}

/// Loads the file (if any), applies environment overrides, and validates.
pub fn load(path: Option<&Path>) -> Result<Loaded, ConfigError> {
    let fallback = match path {
        Some(_) => None,
        None => default_file(),
    };
    let path = path.or(fallback.as_deref());
    let (mut config, paths) = match path {
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .map_err(|e| ConfigError(format!("cannot read {}: {e}", p.display())))?;
            let c = parse(&text).map_err(|e| ConfigError(format!("{}: {e}", p.display())))?;
            (c, vec![p.to_path_buf()])
        }
        None => (Config::default(), Vec::new()),
    };
    apply_env(&mut config)?;
    validate(&config)?;
    Ok(Loaded { config, paths })
}

/// The environment overrides of the configuration (port, host, data directory, database).
pub fn apply_env(config: &mut Config) -> Result<(), ConfigError> {
    if let Ok(port) = std::env::var(ENV_PORT) {
        config.gateway.port = port
            .trim()
            .parse()
            .map_err(|_| ConfigError(format!("{ENV_PORT}={port:?} is not a port number")))?;
    }
    if let Ok(host) = std::env::var(ENV_HOST) {
        config.gateway.host = host;
    }
    if let Ok(dir) = std::env::var(ENV_DATA_DIR) {
        config.gateway.data_dir = Some(PathBuf::from(dir));
    }
    if let Ok(url) = std::env::var(store::ENV_DATABASE_URL) {
        if !url.trim().is_empty() {
            config.store.url = Some(webhooks::Secret::Inline(url));
        }
    }
    Ok(())
}

/// `gateway.trustedProxies` as address blocks (an address is a block of one); the error names
/// the entry that is neither an address nor a CIDR block.
pub fn parse_trusted_proxies(entries: &[String]) -> Result<Vec<ipnet::IpNet>, String> {
    entries
        .iter()
        .map(|e| {
            let e = e.trim();
            e.parse::<ipnet::IpNet>()
                .or_else(|_| e.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
                .map(|net| net.trunc())
                .map_err(|_| format!("'{e}' is not an IP address or CIDR block"))
        })
        .collect()
}

/// Rules serde cannot express.
pub fn validate(config: &Config) -> Result<(), ConfigError> {
    let g = &config.gateway;
    let mut ids = std::collections::BTreeSet::new();
    for (i, t) in g.tokens.iter().enumerate() {
        if t.id.trim().is_empty() {
            return Err(ConfigError(format!(
                "gateway.tokens[{i}].id must not be empty"
            )));
        }
        // Ids with ':' are the gateway's own principals (`webhook:<mapping>`, `heartbeat:...`),
        // which own the sessions of its channels: no token may be one of them.
        if t.id.contains(':') {
            return Err(ConfigError(format!(
                "gateway.tokens[{i}].id '{}' must not contain ':' (reserved for the gateway's own principals)",
                t.id
            )));
        }
        if !ids.insert(t.id.as_str()) {
            return Err(ConfigError(format!(
                "gateway.tokens[{i}].id '{}' repeats",
                t.id
            )));
        }
        if t.secret.chars().count() < MIN_SECRET_LEN {
            return Err(ConfigError(format!(
                "gateway.tokens[{i}].secret (token '{}') is shorter than {MIN_SECRET_LEN} characters",
                t.id
            )));
        }
        for s in &t.scopes {
            if crate::api::generated::methods::Scope::from_name(s).is_none() {
                return Err(ConfigError(format!(
                    "gateway.tokens[{i}].scopes: unknown scope '{s}' (rpc, admin, *, api, mcp-client, metrics)"
                )));
            }
        }
    }
    if g.tls.require_client_cert == Some(true) {
        return Err(ConfigError(
            "gateway.tls.requireClientCert: mutual TLS is not supported by this build; terminate TLS in a proxy".to_owned(),
        ));
    }
    let positive = [
        ("gateway.rateLimit.windowMs", g.rate_limit.window_ms),
        ("gateway.rateLimit.maxRequests", g.rate_limit.max_requests),
        ("gateway.httpBodyLimitBytes", g.http_body_limit_bytes),
        ("gateway.maxBatchSize", g.max_batch_size as u64),
        (
            "gateway.wsMessageRateLimit.maxMessages",
            g.ws_message_rate_limit.max_messages as u64,
        ),
        (
            "gateway.wsMessageRateLimit.windowMs",
            g.ws_message_rate_limit.window_ms,
        ),
        ("gateway.wsMaxMessageBytes", g.ws_max_message_bytes as u64),
        ("gateway.headerReadTimeoutMs", g.header_read_timeout_ms),
        ("gateway.bodyReadTimeoutMs", g.body_read_timeout_ms),
        (
            "gateway.limits.maxConcurrentTurnsPerClient",
            u64::from(g.limits.max_concurrent_turns_per_client),
        ),
        (
            "gateway.limits.maxConcurrentTurns",
            u64::from(g.limits.max_concurrent_turns),
        ),
        ("gateway.maxConnections", g.max_connections as u64),
    ];
    for (key, v) in positive {
        if v == 0 {
            return Err(ConfigError(format!("{key} must be greater than 0")));
        }
    }
    durations(config)?;
    parse_trusted_proxies(&g.trusted_proxies)
        .map_err(|e| ConfigError(format!("gateway.trustedProxies: {e}")))?;
    if config.media.max_file_bytes == 0 || config.media.sweep_interval_seconds == 0 {
        return Err(ConfigError(
            "media.maxFileBytes and media.sweepIntervalSeconds must be greater than 0".to_owned(),
        ));
    }
    provider_policy::validate(&config.provider_policy).map_err(ConfigError)?;
    store::validate(&config.store)?;
    scheduler::validate(&config.scheduler)?;
    autonomy::validate(&config.autonomy)?;
    graphs::validate(&config.graphs)?;
    workspaces::validate(&config.workspaces)?;
    net::validate(&config.net)?;
    context::validate(&config.agent_defaults.context)?;
    secrets::master_key(&config.secrets)?;
    let o = &config.observability;
    if o.trace_retention_hours == 0
        || o.diagnostics_retention_hours == 0
        || o.prompt_reports_per_session == 0
        || o.sweep_interval_seconds == 0
    {
        return Err(ConfigError(
            "observability: traceRetentionHours, diagnosticsRetentionHours, \
             promptReportsPerSession and sweepIntervalSeconds must be at least 1"
                .to_owned(),
        ));
    }
    memory::validate(&config.memory)?;
    if config.config_history.keep == 0 {
        return Err(ConfigError(
            "configHistory.keep must be greater than 0".to_owned(),
        ));
    }
    webhooks::validate(&config.webhooks)
}

/// Top-level sections, sorted.
pub fn sections() -> Vec<String> {
    match serde_json::to_value(Config::default()) {
        Ok(Value::Object(m)) => {
            let mut keys: Vec<String> = m.keys().cloned().collect();
            keys.sort();
            keys
        }
        _ => Vec::new(),
    }
}

/// The configuration as JSON, secrets replaced by `[REDACTED]` (every `secret`, `token`,
/// `password` or `apiKey` text member; the database URL keeps host and database without its
/// password).
pub fn redacted(config: &Config) -> Value {
    let mut v = serde_json::to_value(config).unwrap_or(Value::Null);
    document::redact(&mut v);
    v
}

/// The configuration as JSON, unredacted.
pub fn raw(config: &Config) -> Value {
    serde_json::to_value(config).unwrap_or(Value::Null)
}

/// JSON Schema of the configuration file, generated from these types.
pub fn schema() -> Value {
    serde_json::to_value(schemars::schema_for!(Config)).unwrap_or(Value::Null)
}

/// The data directory: configured, or the user's data directory, or `./.agent-gateway`.
pub fn data_dir(config: &Config) -> PathBuf {
    config.gateway.data_dir.clone().unwrap_or_else(|| {
        dirs::data_dir()
            .map(|d| d.join("agent-gateway"))
            .unwrap_or_else(|| PathBuf::from(".agent-gateway"))
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod duration_cap_tests {
    use super::*;
    use serde_json::json;

    /// The configuration `base` with `value` at the JSON pointer `at`, loaded and validated.
    fn with(base: &Value, at: &str, value: Value) -> Result<(), String> {
        let mut doc = base.clone();
        *doc.pointer_mut(at).unwrap_or_else(|| panic!("{at}")) = value;
        let config = from_value(doc).map_err(|e| e.0)?;
        validate(&config).map_err(|e| e.0)
    }

    /// Every capped duration: its maximum loads, one more (and u64::MAX) is refused naming
    /// the key, and the schema states the maximum.
    #[test]
    fn every_duration_is_capped_at_load_and_in_the_schema() {
        let base = json!({
            "gateway": {
                "wsHeartbeatMs": 1, "web": {"sseKeepAliveMs": 1},
                "rateLimit": {"windowMs": 1}, "wsMessageRateLimit": {"windowMs": 1},
                "headerReadTimeoutMs": 1, "bodyReadTimeoutMs": 1, "shutdownGraceMs": 1
            },
            "media": {"ttlSeconds": 1, "sweepIntervalSeconds": 1},
            "observability": {
                "traceRetentionHours": 1, "diagnosticsRetentionHours": 1,
                "sweepIntervalSeconds": 1
            },
            "store": {
                "acquireTimeoutMs": 1, "connectTimeoutMs": 1, "statementTimeoutMs": 1,
                "nodeHeartbeatMs": 1, "nodeDeadAfterMs": 2
            },
            "scheduler": {
                "lateToleranceMs": 1, "fireTimeoutMs": 1, "runRetention": {"maxAgeDays": 1},
                "heartbeat": {"intervalMs": 10_000}
            },
            "webhooks": {
                "hmac": {"maxAgeSec": 1},
                "mappings": [{"id": "m", "messageTemplate": "x", "timeoutSeconds": 1}]
            },
            "providers": {"p": {"type": "scripted", "timeoutMs": 1000,
                                "script": [{"steps": [{"delayMs": 0}]}]}},
            "agents": {"a": {"model": "p/m", "heartbeat": {"intervalMs": 10_000}}}
        });
        assert_eq!(with(&base, "/gateway/wsHeartbeatMs", json!(1)), Ok(()));
        let cases: &[(&str, &str, u64)] = &[
            (
                "gateway.wsHeartbeatMs",
                "/gateway/wsHeartbeatMs",
                MAX_DAY_MS,
            ),
            (
                "gateway.web.sseKeepAliveMs",
                "/gateway/web/sseKeepAliveMs",
                MAX_DAY_MS,
            ),
            (
                "gateway.rateLimit.windowMs",
                "/gateway/rateLimit/windowMs",
                MAX_DAY_MS,
            ),
            (
                "gateway.wsMessageRateLimit.windowMs",
                "/gateway/wsMessageRateLimit/windowMs",
                MAX_DAY_MS,
            ),
            (
                "gateway.headerReadTimeoutMs",
                "/gateway/headerReadTimeoutMs",
                MAX_HOUR_MS,
            ),
            (
                "gateway.bodyReadTimeoutMs",
                "/gateway/bodyReadTimeoutMs",
                MAX_DAY_MS,
            ),
            (
                "gateway.shutdownGraceMs",
                "/gateway/shutdownGraceMs",
                MAX_HOUR_MS,
            ),
            (
                "media.ttlSeconds",
                "/media/ttlSeconds",
                MAX_MEDIA_TTL_SECONDS,
            ),
            (
                "media.sweepIntervalSeconds",
                "/media/sweepIntervalSeconds",
                MAX_SWEEP_SECONDS,
            ),
            (
                "observability.traceRetentionHours",
                "/observability/traceRetentionHours",
                MAX_RETENTION_HOURS as u64,
            ),
            (
                "observability.diagnosticsRetentionHours",
                "/observability/diagnosticsRetentionHours",
                MAX_RETENTION_HOURS as u64,
            ),
            (
                "observability.sweepIntervalSeconds",
                "/observability/sweepIntervalSeconds",
                MAX_SWEEP_SECONDS,
            ),
            ("store.acquireTimeoutMs", "/store/acquireTimeoutMs", 600_000),
            ("store.connectTimeoutMs", "/store/connectTimeoutMs", 600_000),
            (
                "store.statementTimeoutMs",
                "/store/statementTimeoutMs",
                86_400_000,
            ),
            (
                "store.nodeDeadAfterMs",
                "/store/nodeDeadAfterMs",
                86_400_000,
            ),
            (
                "scheduler.lateToleranceMs",
                "/scheduler/lateToleranceMs",
                604_800_000,
            ),
            (
                "scheduler.fireTimeoutMs",
                "/scheduler/fireTimeoutMs",
                86_400_000,
            ),
            (
                "scheduler.runRetention.maxAgeDays",
                "/scheduler/runRetention/maxAgeDays",
                3_650,
            ),
            (
                "webhooks.hmac.maxAgeSec",
                "/webhooks/hmac/maxAgeSec",
                86_400,
            ),
            (
                "webhooks.mappings[0].timeoutSeconds",
                "/webhooks/mappings/0/timeoutSeconds",
                86_400,
            ),
            ("providers.p.timeoutMs", "/providers/p/timeoutMs", 600_000),
            (
                "providers.p.script[0].steps[0].delayMs",
                "/providers/p/script/0/steps/0/delayMs",
                600_000,
            ),
            (
                "scheduler.heartbeat.intervalMs",
                "/scheduler/heartbeat/intervalMs",
                86_400_000,
            ),
            (
                "agents.a.heartbeat.intervalMs",
                "/agents/a/heartbeat/intervalMs",
                86_400_000,
            ),
        ];
        for (key, at, max) in cases {
            assert_eq!(with(&base, at, json!(max)), Ok(()), "{key} at {max}");
            for v in [max + 1, u64::MAX] {
                let e = with(&base, at, json!(v)).unwrap_err();
                // u64::MAX does not fit some fields at all: then serde names the key.
                let named = e.contains(key) || e.contains(&at[1..].replace('/', "."));
                assert!(named, "{key} = {v}: {e}");
            }
        }
        // store.nodeHeartbeatMs: nodeDeadAfterMs must be at least twice it.
        let mut b = base.clone();
        b["store"]["nodeDeadAfterMs"] = json!(86_400_000);
        assert_eq!(with(&b, "/store/nodeHeartbeatMs", json!(3_600_000)), Ok(()));
        let e = with(&b, "/store/nodeHeartbeatMs", json!(u64::MAX)).unwrap_err();
        assert!(e.contains("store.nodeHeartbeatMs"), "{e}");

        let schema = schema().to_string();
        for (name, max) in [
            ("wsHeartbeatMs", MAX_DAY_MS),
            ("sseKeepAliveMs", MAX_DAY_MS),
            ("connectTimeoutMs", 600_000),
            ("maxAgeSec", 86_400),
            ("lateToleranceMs", 604_800_000),
        ] {
            let member = format!("\"{name}\":{{");
            let i = schema.find(&member).unwrap_or_else(|| panic!("{name}"));
            let end = schema[i..].find('}').map_or(schema.len(), |e| i + e);
            assert!(
                schema[i..end].contains(&format!("\"maximum\":{max}")),
                "{name}: {}",
                &schema[i..end]
            );
        }
    }
}
