//! The REST API's wire types.

use poem_openapi::types::Any;
use poem_openapi::Object;
use serde::Serialize;
use serde_json::Value;

use crate::api::generated::types::TokensUsed;

#[derive(Debug, Clone, Object)]
#[oai(rename = "Health", rename_all = "camelCase")]
pub struct Health {
    /// `ok`.
    pub status: String,
    /// RFC 3339, UTC.
    pub timestamp: String,
}

impl Health {
    /// The answer of `/health` and `/api/health`.
    pub fn now() -> Self {
        Self {
            status: "ok".to_owned(),
            timestamp: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        }
    }
}

#[derive(Debug, Clone, Object)]
#[oai(rename = "AgentSummary", rename_all = "camelCase")]
pub struct AgentSummary {
    pub id: String,
    pub name: String,
    pub provider: String,
    pub model: String,
    pub suspended: bool,
    pub is_default: bool,
}

#[derive(Debug, Clone, Object)]
#[oai(rename = "AgentSummaryList", rename_all = "camelCase")]
pub struct AgentList {
    pub agents: Vec<AgentSummary>,
}

#[derive(Debug, Clone, Object)]
#[oai(rename = "ChannelStatus", rename_all = "camelCase")]
pub struct ChannelStatus {
    pub id: String,
    pub connected: bool,
}

#[derive(Debug, Clone, Object)]
#[oai(rename = "ChannelStatusList", rename_all = "camelCase")]
pub struct ChannelList {
    /// Enabled channel connections (none until a channel capability is configured).
    pub channels: Vec<ChannelStatus>,
}

/// A system event, as `/api/events` sends it and `/api/activity` lists it.
#[derive(Debug, Clone, Object, Serialize)]
#[oai(rename = "SystemEvent", rename_all = "camelCase")]
pub struct EventOut {
    /// Increases by one per event since the gateway started.
    pub seq: u64,
    /// The event name, e.g. `message:received`.
    pub event: String,
    /// Unix epoch milliseconds.
    pub ts: i64,
    pub data: Any<Value>,
}

#[derive(Debug, Clone, Object)]
#[oai(rename = "ActivityList", rename_all = "camelCase")]
pub struct ActivityList {
    /// Newest first.
    pub events: Vec<EventOut>,
}

/// One memory search hit (the `MemorySearchHit` of the method catalogue).
#[derive(Debug, Clone, Object)]
#[oai(rename = "MemoryHit", rename_all = "camelCase")]
pub struct MemoryHitOut {
    pub id: String,
    pub content: String,
    pub tags: Vec<String>,
    /// working, episodic, semantic or procedural.
    pub memory_type: String,
    /// system, learned or external.
    pub trust_level: String,
    pub agent_id: String,
    #[oai(skip_serializing_if_is_none)]
    pub source_session_key: Option<String>,
    pub pinned: bool,
    pub created_at: i64,
    /// Relevance to the query in (0, 1], best first.
    pub score: f64,
}

#[derive(Debug, Clone, Object)]
#[oai(rename = "MemorySearchResult", rename_all = "camelCase")]
pub struct MemorySearch {
    pub results: Vec<MemoryHitOut>,
}

/// Counts and index facts of one tenant's memory (the `MemoryStats` of the method catalogue).
#[derive(Debug, Clone, Object)]
#[oai(rename = "MemoryStats", rename_all = "camelCase")]
pub struct MemoryStats {
    pub tenant_id: String,
    #[oai(nullable)]
    pub agent_id: Option<String>,
    pub total_entries: i64,
    pub pinned_entries: i64,
    pub embedded_entries: i64,
    pub by_type: std::collections::BTreeMap<String, i64>,
    pub by_trust_level: std::collections::BTreeMap<String, i64>,
    pub by_agent: std::collections::BTreeMap<String, i64>,
    pub total_sessions: i64,
    pub observations: i64,
    pub entities: i64,
    pub fts_indexed: bool,
    pub vector_indexed: bool,
    pub db_size_bytes: i64,
    #[oai(nullable)]
    pub oldest_created_at: Option<i64>,
    #[oai(nullable)]
    pub newest_created_at: Option<i64>,
}

#[derive(Debug, Clone, Object)]
#[oai(rename = "ChatSession", rename_all = "camelCase")]
pub struct ChatSession {
    pub session_key: String,
    pub agent_id: String,
    pub channel: String,
    pub message_count: i64,
    pub input_tokens: i64,
    pub output_tokens: i64,
    #[oai(nullable)]
    pub last_model: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
}

#[derive(Debug, Clone, Object)]
#[oai(rename = "ChatHistory", rename_all = "camelCase")]
pub struct ChatHistory {
    /// Most recently updated first.
    pub sessions: Vec<ChatSession>,
}

/// `POST /api/chat`.
#[derive(Debug, Clone, Object)]
#[oai(rename = "ChatRequest", rename_all = "camelCase", deny_unknown_fields)]
pub struct ChatRequest {
    #[oai(validator(min_length = 1))]
    pub message: String,
    /// The default agent when omitted.
    pub agent_id: Option<String>,
    /// Continues the conversation of this key (your own; created on first use).
    #[oai(validator(min_length = 1, max_length = 200))]
    pub session_key: Option<String>,
}

#[derive(Debug, Clone, Object, Serialize)]
#[oai(rename = "TokensUsed", rename_all = "camelCase")]
pub struct Tokens {
    pub input: i64,
    pub output: i64,
    pub total: i64,
}

impl From<TokensUsed> for Tokens {
    fn from(t: TokensUsed) -> Self {
        Self {
            input: t.input,
            output: t.output,
            total: t.total,
        }
    }
}

/// An agent turn's result (also the `done` event of `/api/chat/stream`).
#[derive(Debug, Clone, Object, Serialize)]
#[oai(rename = "ChatResult", rename_all = "camelCase")]
#[serde(rename_all = "camelCase")]
pub struct ChatResult {
    pub response: String,
    pub tokens_used: Tokens,
    /// `stop`, `max_steps`, `budget_exceeded`, `circuit_open`, `context_loop` or `error`.
    pub finish_reason: String,
}

/// A `token` event of `/api/chat/stream`.
#[derive(Debug, Clone, Object, Serialize)]
#[oai(rename = "ChatToken", rename_all = "camelCase")]
pub struct ChatToken {
    pub delta: String,
    /// The answer so far.
    pub accumulated: String,
}
