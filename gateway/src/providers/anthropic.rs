//! The `anthropic` provider: the Anthropic Messages HTTP API, streaming or not (no embeddings).

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{json, Map, Value};
use tokio_util::sync::CancellationToken;

use super::client::{self, null_default, Http};
use super::sse::SseReader;
use super::{
    BoxFuture, ChatMessage, ChatRequest, ChatResponse, DeltaSink, Embeddings, ErrorKind, Provider,
    ProviderConnection, ProviderError, Role, StopReason, ToolCall, Usage,
};

/// The public endpoint, used when the settings give no base URL.
pub const DEFAULT_BASE_URL: &str = "https://api.anthropic.com";
/// The API version header value sent with every call.
pub const API_VERSION: &str = "2023-06-01";
/// `max_tokens` is required by the API; this is sent when the request has none.
pub const DEFAULT_MAX_TOKENS: u32 = 4096;

/// The Anthropic Messages API.
pub struct AnthropicProvider {
    id: String,
    /// Full URL of the messages endpoint.
    messages_url: http::Uri,
    api_key_env: Option<String>,
    http: Http,
}

impl std::fmt::Debug for AnthropicProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnthropicProvider")
            .field("id", &self.id)
            .field("messages_url", &self.messages_url)
            .finish_non_exhaustive()
    }
}

impl AnthropicProvider {
    /// Builds the provider and its pooled HTTP client. A missing key is reported by each call
    /// (as MissingKey), so the provider can exist before its key is set.
    pub fn new(settings: ProviderConnection) -> Result<Self, ProviderError> {
        let base = client::base_url(&settings, DEFAULT_BASE_URL)?;
        let mut http =
            Http::new(&settings, &base)?.with_header("anthropic-version", API_VERSION, false)?;
        if let Some(key) = http.api_key().map(str::to_owned) {
            http = http.with_header("x-api-key", &key, true)?;
        }
        // A base URL that already names the version ("…/v1") is not given a second one.
        let path = if base.ends_with("/v1") {
            "/messages"
        } else {
            "/v1/messages"
        };
        let messages_url = client::endpoint(&settings.id, &base, path)?;
        Ok(Self {
            id: settings.id,
            messages_url,
            api_key_env: settings.api_key_env,
            http,
        })
    }

    async fn chat_once(
        &self,
        req: &ChatRequest,
        sink: Option<&DeltaSink>,
    ) -> Result<ChatResponse, ProviderError> {
        if self.http.api_key().is_none() {
            let source = match self.api_key_env.as_deref() {
                Some(var) => format!(
                    "store {var} with env.set or secrets.set, or set that environment variable"
                ),
                None => "configure apiKeyEnv for it".to_string(),
            };
            return Err(ProviderError::new(
                ErrorKind::MissingKey,
                format!("provider {} has no Anthropic API key: {source}", self.id),
            ));
        }
        let body = request_body(req, sink.is_some());
        tracing::debug!(provider = %self.id, model = %req.model, stream = sink.is_some(), "anthropic chat");
        let response = self.http.post_json(&self.messages_url, &body).await?;
        match sink {
            Some(sink) => self.read_stream(response, sink).await,
            None => {
                let message: WireMessage = self.http.json(response, "messages answer").await?;
                Ok(message_response(message))
            }
        }
    }

    async fn read_stream(
        &self,
        response: client::Answer,
        sink: &DeltaSink,
    ) -> Result<ChatResponse, ProviderError> {
        let mut events = SseReader::new(response.into_body());
        let mut state = StreamState::default();
        while !state.stopped {
            let event = events
                .next()
                .await
                .map_err(|err| self.http.transport_error(&err))?;
            let Some(event) = event else { break };
            if event.data.trim().is_empty() {
                continue;
            }
            let parsed: Event = serde_json::from_str(&event.data)
                .map_err(|err| self.http.malformed("stream event", &err))?;
            let kind = parsed.kind.clone().or(event.event).unwrap_or_default();
            if kind == "error" {
                return Err(self.stream_error(parsed.error.as_ref()));
            }
            state.apply(&kind, parsed, sink);
        }
        if !state.stopped && state.stop_reason.is_none() {
            return Err(self.http.error(
                ErrorKind::Network,
                "the stream ended before the message finished",
            ));
        }
        Ok(state.into_response())
    }

    /// An `error` event: the API's error type picks the kind.
    fn stream_error(&self, error: Option<&Value>) -> ProviderError {
        let text = |field: &str| {
            error
                .and_then(|e| e.get(field))
                .and_then(Value::as_str)
                .unwrap_or_default()
        };
        let kind = match text("type") {
            "rate_limit_error" => ErrorKind::RateLimited,
            "authentication_error" | "permission_error" => ErrorKind::Auth,
            "not_found_error" => ErrorKind::NotFound,
            "invalid_request_error" | "request_too_large" => ErrorKind::InvalidRequest,
            _ => ErrorKind::ProviderError,
        };
        let message = match (text("message"), text("type")) {
            ("", "") => "unknown error".to_string(),
            (m, "") => m.to_string(),
            ("", t) => t.to_string(),
            (m, t) => format!("{m} ({t})"),
        };
        self.http
            .log_upstream("error event in the stream", &message);
        self.http
            .error(kind, "the server reported an error in the stream")
    }
}

impl Provider for AnthropicProvider {
    fn chat<'a>(
        &'a self,
        req: &'a ChatRequest,
        sink: Option<&'a DeltaSink>,
        cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<ChatResponse, ProviderError>> {
        Box::pin(self.http.run(cancel, self.chat_once(req, sink)))
    }

    fn bounds_its_calls(&self) -> bool {
        true
    }

    fn embed<'a>(
        &'a self,
        _model: &'a str,
        _inputs: &'a [String],
        _cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<Embeddings, ProviderError>> {
        Box::pin(async {
            Err(ProviderError::new(
                ErrorKind::InvalidRequest,
                "anthropic has no embeddings API",
            ))
        })
    }
}

/// The Messages request body.
fn request_body(req: &ChatRequest, stream: bool) -> Value {
    let mut body = Map::new();
    body.insert("model".into(), json!(req.model));
    body.insert(
        "max_tokens".into(),
        json!(req.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS)),
    );
    if let Some(system) = req.system.as_deref().filter(|s| !s.is_empty()) {
        body.insert("system".into(), json!(system));
    }
    body.insert(
        "messages".into(),
        Value::Array(wire_messages(&req.messages)),
    );
    if !req.tools.is_empty() {
        let tools: Vec<Value> = req
            .tools
            .iter()
            .map(|tool| {
                json!({
                    "name": tool.name,
                    "description": tool.description,
                    "input_schema": tool.parameters,
                })
            })
            .collect();
        body.insert("tools".into(), Value::Array(tools));
    }
    if let Some(temperature) = req.temperature {
        body.insert("temperature".into(), json!(temperature));
    }
    if stream {
        body.insert("stream".into(), json!(true));
    }
    Value::Object(body)
}

/// The conversation as alternating user/assistant messages of content blocks: tool results
/// become user messages, and consecutive messages of one role are merged (tool results first
/// in a user message, as the API requires). Messages with nothing to send are left out.
fn wire_messages(messages: &[ChatMessage]) -> Vec<Value> {
    let mut merged: Vec<(&'static str, Vec<Value>)> = Vec::new();
    for message in messages {
        let (role, blocks) = match message.role {
            Role::User => ("user", text_block(&message.content).into_iter().collect()),
            Role::Assistant => {
                let mut blocks: Vec<Value> = text_block(&message.content).into_iter().collect();
                blocks.extend(message.tool_calls.iter().map(|call| {
                    json!({
                        "type": "tool_use",
                        "id": call.id,
                        "name": call.name,
                        "input": tool_input(&call.arguments),
                    })
                }));
                ("assistant", blocks)
            }
            Role::Tool => (
                "user",
                vec![json!({
                    "type": "tool_result",
                    "tool_use_id": message.tool_call_id.as_deref().unwrap_or_default(),
                    "content": message.content,
                    "is_error": message.is_error,
                })],
            ),
        };
        if blocks.is_empty() {
            continue;
        }
        match merged.last_mut() {
            Some((last_role, last_blocks)) if *last_role == role => last_blocks.extend(blocks),
            _ => merged.push((role, blocks)),
        }
    }
    merged
        .into_iter()
        .map(|(role, mut blocks)| {
            if role == "user" {
                // stable: tool results keep their order, then the texts
                blocks.sort_by_key(|b| b.get("type") != Some(&json!("tool_result")));
            }
            json!({"role": role, "content": blocks})
        })
        .collect()
}

/// A text block; the API refuses empty ones.
fn text_block(text: &str) -> Option<Value> {
    (!text.is_empty()).then(|| json!({"type": "text", "text": text}))
}

/// A tool_use input must be an object: other values (a non-JSON argument string kept from
/// another provider) are wrapped as `{"input": value}`.
fn tool_input(arguments: &Value) -> Value {
    match arguments {
        Value::Object(_) => arguments.clone(),
        Value::Null => Value::Object(Map::new()),
        other => json!({"input": other}),
    }
}

fn stop_reason(reason: Option<&str>, has_tool_calls: bool) -> StopReason {
    if has_tool_calls {
        return StopReason::ToolCalls;
    }
    match reason {
        Some("max_tokens") => StopReason::Length,
        // end_turn, stop_sequence, tool_use without a call, pause_turn, refusal, none
        _ => StopReason::Stop,
    }
}

fn message_response(message: WireMessage) -> ChatResponse {
    let mut content = String::new();
    let mut tool_calls = Vec::new();
    for block in message.content {
        match block.kind.as_str() {
            "text" => content.push_str(block.text.as_deref().unwrap_or_default()),
            "tool_use" => tool_calls.push(ToolCall {
                id: block
                    .id
                    .filter(|id| !id.is_empty())
                    .unwrap_or_else(client::new_call_id),
                name: block.name.unwrap_or_default(),
                arguments: block.input.unwrap_or_else(|| Value::Object(Map::new())),
            }),
            _ => {} // thinking and other blocks are not part of the answer
        }
    }
    ChatResponse {
        content,
        stop: stop_reason(message.stop_reason.as_deref(), !tool_calls.is_empty()),
        tool_calls,
        usage: message.usage.map(Usage::from).unwrap_or_default(),
    }
}

#[derive(Debug)]
struct ToolBlock {
    id: String,
    name: String,
    /// The input given by content_block_start (normally `{}`).
    start_input: Option<Value>,
    json: String,
}

#[derive(Debug, Default)]
struct StreamState {
    content: String,
    tools: BTreeMap<u64, ToolBlock>,
    usage: WireUsage,
    stop_reason: Option<String>,
    stopped: bool,
}

impl StreamState {
    fn apply(&mut self, kind: &str, event: Event, sink: &DeltaSink) {
        match kind {
            "message_start" => {
                if let Some(usage) = event.message.and_then(|m| m.usage) {
                    self.usage.update(usage);
                }
            }
            "content_block_start" => {
                let Some(block) = event.content_block else {
                    return;
                };
                let index = event.index.unwrap_or(0);
                match block.kind.as_str() {
                    "text" => {
                        if let Some(text) = block.text.filter(|t| !t.is_empty()) {
                            self.text(text, sink);
                        }
                    }
                    "tool_use" => {
                        self.tools.insert(
                            index,
                            ToolBlock {
                                id: block.id.unwrap_or_default(),
                                name: block.name.unwrap_or_default(),
                                start_input: block.input,
                                json: String::new(),
                            },
                        );
                    }
                    _ => {}
                }
            }
            "content_block_delta" => {
                let Some(delta) = event.delta else { return };
                match delta.kind.as_deref() {
                    Some("text_delta") => {
                        if let Some(text) = delta.text.filter(|t| !t.is_empty()) {
                            self.text(text, sink);
                        }
                    }
                    Some("input_json_delta") => {
                        let index = event.index.unwrap_or(0);
                        if let (Some(tool), Some(part)) =
                            (self.tools.get_mut(&index), delta.partial_json)
                        {
                            tool.json.push_str(&part);
                        }
                    }
                    _ => {} // thinking, signature, citations
                }
            }
            "message_delta" => {
                if let Some(reason) = event.delta.and_then(|d| d.stop_reason) {
                    self.stop_reason = Some(reason);
                }
                if let Some(usage) = event.usage {
                    self.usage.update(usage);
                }
            }
            "message_stop" => self.stopped = true,
            _ => {} // content_block_stop, ping, unknown events
        }
    }

    fn text(&mut self, text: String, sink: &DeltaSink) {
        self.content.push_str(&text);
        // A closed receiver is fine: the call still completes.
        let _ = sink.send(text);
    }

    fn into_response(self) -> ChatResponse {
        let tool_calls: Vec<ToolCall> = self
            .tools
            .into_values()
            .map(|tool| {
                let arguments = if tool.json.trim().is_empty() {
                    tool.start_input
                        .filter(Value::is_object)
                        .unwrap_or_else(|| Value::Object(Map::new()))
                } else {
                    client::parse_arguments(&tool.json)
                };
                ToolCall {
                    id: if tool.id.is_empty() {
                        client::new_call_id()
                    } else {
                        tool.id
                    },
                    name: tool.name,
                    arguments,
                }
            })
            .collect();
        ChatResponse {
            content: self.content,
            stop: stop_reason(self.stop_reason.as_deref(), !tool_calls.is_empty()),
            tool_calls,
            usage: self.usage.into(),
        }
    }
}

// ---- wire types (lenient: unknown fields ignored, nulls tolerated) ----

#[derive(Debug, Deserialize)]
struct WireMessage {
    #[serde(default, deserialize_with = "null_default")]
    content: Vec<Block>,
    #[serde(default)]
    stop_reason: Option<String>,
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Debug, Deserialize)]
struct Block {
    #[serde(rename = "type", default)]
    kind: String,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    input: Option<Value>,
}

#[derive(Debug, Default, Deserialize)]
struct WireUsage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
}

impl WireUsage {
    /// Stream usage is cumulative: later values replace earlier ones.
    fn update(&mut self, newer: WireUsage) {
        self.input_tokens = newer.input_tokens.or(self.input_tokens);
        self.output_tokens = newer.output_tokens.or(self.output_tokens);
        self.cache_creation_input_tokens = newer
            .cache_creation_input_tokens
            .or(self.cache_creation_input_tokens);
        self.cache_read_input_tokens = newer
            .cache_read_input_tokens
            .or(self.cache_read_input_tokens);
    }
}

impl From<WireUsage> for Usage {
    fn from(usage: WireUsage) -> Self {
        let cached = usage.cache_read_input_tokens.unwrap_or(0);
        Self {
            input: usage.input_tokens.unwrap_or(0)
                + cached
                + usage.cache_creation_input_tokens.unwrap_or(0),
            output: usage.output_tokens.unwrap_or(0),
            cached_input: cached,
            cache_write: usage.cache_creation_input_tokens.unwrap_or(0),
        }
    }
}

#[derive(Debug, Deserialize)]
struct Event {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(default)]
    message: Option<StartMessage>,
    #[serde(default)]
    index: Option<u64>,
    #[serde(default)]
    content_block: Option<Block>,
    #[serde(default)]
    delta: Option<EventDelta>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct StartMessage {
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Debug, Deserialize)]
struct EventDelta {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    partial_json: Option<String>,
    #[serde(default)]
    stop_reason: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(id: &str) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: "f".into(),
            arguments: json!({"x": 1}),
        }
    }

    #[test]
    fn tool_results_merge_into_one_user_message_before_text() {
        let (a, b) = (call("t1"), call("t2"));
        let messages = vec![
            ChatMessage::user("q"),
            ChatMessage::assistant("thinking", vec![a.clone(), b.clone()]),
            ChatMessage::tool(&a, "ra", false),
            ChatMessage::tool(&b, "rb", true),
            ChatMessage::user("and then?"),
            ChatMessage::assistant("", vec![]),
            ChatMessage::user("again"),
        ];
        let wire = wire_messages(&messages);
        assert_eq!(wire.len(), 3, "{wire:#?}");
        assert_eq!(wire[0]["role"], "user");
        assert_eq!(wire[1]["role"], "assistant");
        assert_eq!(wire[1]["content"][1]["type"], "tool_use");
        assert_eq!(wire[1]["content"][2]["input"], json!({"x": 1}));
        let results = &wire[2]["content"];
        assert_eq!(wire[2]["role"], "user");
        assert_eq!(results[0]["tool_use_id"], "t1");
        assert_eq!(results[0]["is_error"], false);
        assert_eq!(results[1]["tool_use_id"], "t2");
        assert_eq!(results[1]["is_error"], true);
        assert_eq!(results[2]["text"], "and then?");
        assert_eq!(results[3]["text"], "again");
    }

    #[test]
    fn text_before_tool_result_is_moved_after_it() {
        let a = call("t1");
        let messages = vec![
            ChatMessage::assistant("", vec![a.clone()]),
            ChatMessage::user("note"),
            ChatMessage::tool(&a, "ra", false),
        ];
        let wire = wire_messages(&messages);
        assert_eq!(wire[1]["content"][0]["type"], "tool_result");
        assert_eq!(wire[1]["content"][1]["type"], "text");
    }

    #[test]
    fn non_object_inputs_are_wrapped() {
        assert_eq!(tool_input(&json!("raw")), json!({"input": "raw"}));
        assert_eq!(tool_input(&Value::Null), json!({}));
    }

    #[test]
    fn usage_adds_cache_tokens() {
        let usage: Usage = WireUsage {
            input_tokens: Some(10),
            output_tokens: Some(5),
            cache_creation_input_tokens: Some(3),
            cache_read_input_tokens: Some(100),
        }
        .into();
        assert_eq!(
            usage,
            Usage {
                input: 113,
                output: 5,
                cached_input: 100,
                cache_write: 3,
            }
        );
    }

    #[test]
    fn default_max_tokens() {
        let req = ChatRequest {
            model: "m".into(),
            system: None,
            messages: vec![ChatMessage::user("hi")],
            tools: vec![],
            max_tokens: None,
            temperature: Some(0.7),
        };
        let body = request_body(&req, true);
        assert_eq!(body["max_tokens"], json!(DEFAULT_MAX_TOKENS));
        assert!(body.get("system").is_none());
        assert_eq!(body["stream"], json!(true));
        // Sent as the caller gave it (an f32 on the way would send 0.699999988079071).
        assert!(body.to_string().contains(r#""temperature":0.7"#), "{body}");
    }
}
