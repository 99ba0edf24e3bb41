//! The provider interface every model backend implements (openai, anthropic, local, scripted),
//! the request/response types the agent turn speaks, and provider errors.
//!
//! A provider makes exactly one attempt per call; retries, backoff, per-call timeouts and
//! failover live in [`retry`] and in the agent turn, so every backend gets them the same way.

pub mod anthropic;
mod client;
pub mod local;
pub mod models;
pub mod openai;
pub mod policy;
pub mod registry;
pub mod retry;
pub mod scripted;
mod sse;
pub mod tokens;

pub use client::extra_roots_problem;

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

/// A boxed, sendable future (the trait is used as `dyn Provider`).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Which implementation a provider is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProviderKind {
    Openai,
    Anthropic,
    Local,
    Scripted,
}

impl ProviderKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Openai => "openai",
            Self::Anthropic => "anthropic",
            Self::Local => "local",
            Self::Scripted => "scripted",
        }
    }
}

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    User,
    Assistant,
    Tool,
}

/// One tool call requested by the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// Provider-given call id (made up when the provider gives none).
    pub id: String,
    pub name: String,
    /// Parsed JSON arguments; a string the model produced that is not JSON is kept as a string.
    pub arguments: Value,
}

/// One message of the conversation sent to the model. The system prompt travels separately.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: Role,
    /// Text; empty for an assistant message that only calls tools.
    pub content: String,
    /// Assistant messages only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// Tool messages only: the call answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// Tool messages only: the tool that answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_name: Option<String>,
    /// Tool messages only: the content is an error text.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub is_error: bool,
}

impl ChatMessage {
    pub fn user(text: impl Into<String>) -> Self {
        Self {
            role: Role::User,
            content: text.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
            tool_name: None,
            is_error: false,
        }
    }

    pub fn assistant(text: impl Into<String>, tool_calls: Vec<ToolCall>) -> Self {
        Self {
            role: Role::Assistant,
            content: text.into(),
            tool_calls,
            tool_call_id: None,
            tool_name: None,
            is_error: false,
        }
    }

    pub fn tool(call: &ToolCall, content: impl Into<String>, is_error: bool) -> Self {
        Self {
            role: Role::Tool,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: Some(call.id.clone()),
            tool_name: Some(call.name.clone()),
            is_error,
        }
    }
}

/// A tool the model may call: name, description and JSON Schema of its arguments.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    pub parameters: Value,
}

/// One model call.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatRequest {
    /// Model id within the provider (no `<provider>/` prefix).
    pub model: String,
    /// System prompt; None or empty means none.
    pub system: Option<String>,
    pub messages: Vec<ChatMessage>,
    /// Tools offered; empty means the model is called without tools.
    pub tools: Vec<ToolSpec>,
    pub max_tokens: Option<u32>,
    pub temperature: Option<f64>,
}

/// Token usage of one call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens, including cached ones.
    pub input: u64,
    pub output: u64,
    /// Prompt tokens served from the provider's prompt cache (0 when unknown).
    pub cached_input: u64,
    /// Prompt tokens written to the provider's prompt cache (0 when unknown).
    #[serde(default)]
    pub cache_write: u64,
}

/// Why the model stopped producing this response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// A final answer (or the model ended its turn).
    Stop,
    /// The output token limit was reached.
    Length,
    /// The model asked for tool calls.
    ToolCalls,
}

/// The result of one model call.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatResponse {
    pub content: String,
    pub tool_calls: Vec<ToolCall>,
    pub usage: Usage,
    pub stop: StopReason,
}

/// Receives text deltas while a call streams. Sending never blocks; a closed receiver is
/// ignored (the call still completes so its usage is recorded). A sink knows whether it has
/// passed a delta on: a retry must not repeat text the caller already has.
#[derive(Debug, Clone)]
pub struct DeltaSink {
    tx: tokio::sync::mpsc::UnboundedSender<String>,
    sent: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// The flag of the sink this one was made from: a delta through an attempt's sink also
    /// counts for the model step around it (which must then not fall back to another model).
    outer: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
}

impl DeltaSink {
    pub fn new(tx: tokio::sync::mpsc::UnboundedSender<String>) -> Self {
        Self {
            tx,
            sent: std::sync::Arc::default(),
            outer: None,
        }
    }

    /// Passes a delta on.
    pub fn send(&self, text: String) -> Result<(), tokio::sync::mpsc::error::SendError<String>> {
        self.sent.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(outer) = &self.outer {
            outer.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        self.tx.send(text)
    }

    /// A sink to the same receiver that counts only its own deltas (one per attempt, or one
    /// per model step); its deltas also count for this sink.
    pub fn attempt(&self) -> Self {
        Self {
            outer: Some(self.sent.clone()),
            ..Self::new(self.tx.clone())
        }
    }

    /// Whether a delta went through this sink.
    pub fn sent_any(&self) -> bool {
        self.sent.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl From<tokio::sync::mpsc::UnboundedSender<String>> for DeltaSink {
    fn from(tx: tokio::sync::mpsc::UnboundedSender<String>) -> Self {
        Self::new(tx)
    }
}

/// Embedding vectors, one per input, and the tokens used.
#[derive(Debug, Clone, PartialEq)]
pub struct Embeddings {
    pub vectors: Vec<Vec<f32>>,
    pub input_tokens: u64,
}

/// Why a provider call failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The key was refused (401/403).
    Auth,
    /// Unknown model or endpoint (404).
    NotFound,
    /// 429.
    RateLimited,
    /// The call took longer than its timeout.
    Timeout,
    /// The endpoint could not be reached, or the connection broke.
    Network,
    /// Any other provider failure (5xx, malformed answer, ...).
    ProviderError,
    /// The API key environment variable is not set.
    MissingKey,
    /// The provider cannot serve now (local model not fetched or still loading, disabled).
    Unavailable,
    /// The provider refused the request as invalid (400, 413, 422).
    InvalidRequest,
    /// The caller went away.
    Cancelled,
}

impl ErrorKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auth => "auth",
            Self::NotFound => "not_found",
            Self::RateLimited => "rate_limited",
            Self::Timeout => "timeout",
            Self::Network => "network",
            Self::ProviderError => "provider_error",
            Self::MissingKey => "missing_key",
            Self::Unavailable => "unavailable",
            Self::InvalidRequest => "invalid_request",
            Self::Cancelled => "cancelled",
        }
    }
}

/// A failed provider call. `message` must never contain a credential.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{kind:?}: {message}")]
pub struct ProviderError {
    pub kind: ErrorKind,
    pub message: String,
    /// HTTP status, when the failure was an HTTP answer.
    pub status: Option<u16>,
    /// Server-requested wait before retrying (Retry-After), when given.
    pub retry_after: Option<Duration>,
}

impl ProviderError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            status: None,
            retry_after: None,
        }
    }

    /// Maps an HTTP error status to a kind (401/403 auth, 404 not found, 429 rate limited,
    /// 400/413/422 invalid request, 408/504 timeout, everything else provider error).
    pub fn from_status(status: u16, message: impl Into<String>) -> Self {
        let kind = match status {
            401 | 403 => ErrorKind::Auth,
            404 => ErrorKind::NotFound,
            429 => ErrorKind::RateLimited,
            400 | 413 | 422 => ErrorKind::InvalidRequest,
            408 | 504 => ErrorKind::Timeout,
            _ => ErrorKind::ProviderError,
        };
        Self {
            kind,
            message: message.into(),
            status: Some(status),
            retry_after: None,
        }
    }

    /// What a caller may be told: the kind and the status, never the message (which can
    /// carry text from the upstream's answer; it goes to the log).
    pub fn public_message(&self) -> String {
        match self.status {
            Some(status) => format!(
                "The model call failed ({}, upstream HTTP {status})",
                self.kind.as_str()
            ),
            None => format!("The model call failed ({})", self.kind.as_str()),
        }
    }

    /// Worth another attempt: network failures, timeouts, 429 and 5xx.
    pub fn retryable(&self) -> bool {
        match self.kind {
            ErrorKind::Network | ErrorKind::Timeout | ErrorKind::RateLimited => true,
            ErrorKind::ProviderError => self.status.is_none_or(|s| s >= 500),
            _ => false,
        }
    }
}

/// One model backend. Each call is a single attempt; dropping the future (or cancelling
/// `cancel`) must stop the work promptly (close the HTTP stream, stop generating).
pub trait Provider: Send + Sync {
    /// Chat completion. With `sink`, text deltas are sent as they arrive (the response still
    /// carries the whole text); without, the provider may use a non-streaming call.
    fn chat<'a>(
        &'a self,
        req: &'a ChatRequest,
        sink: Option<&'a DeltaSink>,
        cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<ChatResponse, ProviderError>>;

    /// Whether the provider itself ends each call at its timeout and on cancellation (the
    /// HTTP providers do); the retry layer then adds no timer and no cancellation watch of
    /// its own around the call.
    fn bounds_its_calls(&self) -> bool {
        false
    }

    /// Embeddings of each input, in order.
    fn embed<'a>(
        &'a self,
        model: &'a str,
        inputs: &'a [String],
        cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<Embeddings, ProviderError>>;
}

/// What a provider instance is built from (a providers.* record with its key resolved).
#[derive(Clone)]
pub struct ProviderConnection {
    pub id: String,
    pub kind: ProviderKind,
    /// API base URL; None means the kind's public endpoint.
    pub base_url: Option<String>,
    /// The resolved API key (from the variable named by apiKeyEnv), if any.
    pub api_key: Option<String>,
    /// Name of the variable the key comes from, for error messages.
    pub api_key_env: Option<String>,
    /// Per-call timeout (applied by the caller around each attempt, and as the HTTP timeout).
    pub timeout: Duration,
    /// For a base URL set through the API: every address its host resolves to when
    /// connecting is checked again (a name that resolved to a public address when the provider
    /// was created may point elsewhere later). None for the configuration file's URLs.
    pub address_guard: Option<std::sync::Arc<crate::net::NetPolicy>>,
}

impl std::fmt::Debug for ProviderConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderConnection")
            .field("id", &self.id)
            .field("kind", &self.kind)
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "[REDACTED]"))
            .field("api_key_env", &self.api_key_env)
            .field("timeout", &self.timeout)
            .field("address_guard", &self.address_guard.is_some())
            .finish()
    }
}
