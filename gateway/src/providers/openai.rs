//! The `openai` provider: the OpenAI Chat Completions and Embeddings HTTP APIs, also spoken by
//! local servers (Ollama, vLLM, llama.cpp), streaming or not.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use tokio_util::sync::CancellationToken;

use super::client::{self, null_default, Http};
use super::sse::SseReader;
use super::{
    BoxFuture, ChatMessage, ChatRequest, ChatResponse, DeltaSink, Embeddings, ErrorKind, Provider,
    ProviderConnection, ProviderError, Role, StopReason, ToolCall, Usage,
};

/// The public endpoint, used when the settings give no base URL.
pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";

/// An OpenAI-compatible endpoint.
pub struct OpenAiProvider {
    id: String,
    base: String,
    /// `<base>/chat/completions` and `<base>/embeddings`, parsed once (not per call).
    chat_url: http::Uri,
    embeddings_url: http::Uri,
    http: Http,
}

impl std::fmt::Debug for OpenAiProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiProvider")
            .field("id", &self.id)
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

impl OpenAiProvider {
    /// Builds the provider and its pooled HTTP client. Without an API key, calls are sent
    /// without an Authorization header (local servers need none).
    pub fn new(settings: ProviderConnection) -> Result<Self, ProviderError> {
        let base = client::base_url(&settings, DEFAULT_BASE_URL)?;
        let mut http = Http::new(&settings, &base)?;
        if let Some(key) = http.api_key().map(str::to_owned) {
            http = http.with_header("authorization", &format!("Bearer {key}"), true)?;
        }
        Ok(Self {
            chat_url: client::endpoint(&settings.id, &base, "/chat/completions")?,
            embeddings_url: client::endpoint(&settings.id, &base, "/embeddings")?,
            id: settings.id,
            base,
            http,
        })
    }

    async fn chat_once(
        &self,
        req: &ChatRequest,
        sink: Option<&DeltaSink>,
    ) -> Result<ChatResponse, ProviderError> {
        let body = request_body(req, sink.is_some());
        tracing::debug!(provider = %self.id, model = %req.model, stream = sink.is_some(), "openai chat");
        let response = self.http.post_json(&self.chat_url, &body).await?;
        match sink {
            Some(sink) if !client::is_json(response.headers()) => {
                self.read_stream(response, sink).await
            }
            _ => {
                let completion: Completion = self.http.json(response, "chat completion").await?;
                let result = self.completion_response(completion)?;
                if let Some(sink) = sink.filter(|_| !result.content.is_empty()) {
                    // The server answered a streaming request in one piece.
                    let _ = sink.send(result.content.clone());
                }
                Ok(result)
            }
        }
    }

    fn completion_response(&self, completion: Completion) -> Result<ChatResponse, ProviderError> {
        if let Some(error) = completion.error {
            return Err(self.stream_error(&error));
        }
        let Some(choice) = completion.choices.into_iter().next() else {
            return Err(self.http.error(
                ErrorKind::ProviderError,
                "the chat completion has no choices",
            ));
        };
        let message = choice.message.unwrap_or_default();
        let mut tool_calls: Vec<ToolCall> = message
            .tool_calls
            .into_iter()
            .map(|call| {
                let function = call.function.unwrap_or_default();
                tool_call(call.id, function.name, function.arguments)
            })
            .collect();
        if let Some(function) = message.function_call {
            tool_calls.push(tool_call(None, function.name, function.arguments));
        }
        Ok(ChatResponse {
            content: content_text(message.content),
            stop: stop_reason(choice.finish_reason.as_deref(), !tool_calls.is_empty()),
            tool_calls,
            usage: completion.usage.map(Usage::from).unwrap_or_default(),
        })
    }

    async fn read_stream(
        &self,
        response: client::Answer,
        sink: &DeltaSink,
    ) -> Result<ChatResponse, ProviderError> {
        let mut events = SseReader::new(response.into_body());
        let mut state = StreamState::default();
        loop {
            let event = events
                .next()
                .await
                .map_err(|err| self.http.transport_error(&err))?;
            let Some(event) = event else { break };
            let data = event.data.trim();
            if data == "[DONE]" {
                state.done = true;
                break;
            }
            if data.is_empty() {
                continue;
            }
            let chunk: Chunk = serde_json::from_str(data)
                .map_err(|err| self.http.malformed("stream chunk", &err))?;
            if let Some(error) = chunk.error {
                return Err(self.stream_error(&error));
            }
            state.apply(chunk, sink);
        }
        if !state.done && state.finish.is_none() {
            return Err(self.http.error(
                ErrorKind::Network,
                "the stream ended before the completion finished",
            ));
        }
        Ok(state.into_response())
    }

    /// An `error` object inside a 200 answer (some servers report failures mid-stream).
    fn stream_error(&self, error: &Value) -> ProviderError {
        let message = error
            .get("message")
            .and_then(Value::as_str)
            .or_else(|| error.as_str())
            .unwrap_or("unknown error");
        self.http.log_upstream("error in the stream", message);
        self.http.error(
            ErrorKind::ProviderError,
            "the server reported an error in the stream",
        )
    }

    async fn embed_once(
        &self,
        model: &str,
        inputs: &[String],
    ) -> Result<Embeddings, ProviderError> {
        if inputs.is_empty() {
            return Ok(Embeddings {
                vectors: Vec::new(),
                input_tokens: 0,
            });
        }
        let body = json!({"model": model, "input": inputs, "encoding_format": "float"});
        let response = self.http.post_json(&self.embeddings_url, &body).await?;
        let answer: EmbeddingAnswer = self.http.json(response, "embeddings answer").await?;
        let mut data = answer.data;
        data.sort_by_key(|d| d.index);
        if data.len() != inputs.len() {
            return Err(self.http.error(
                ErrorKind::ProviderError,
                &format!("asked for {} embeddings, got {}", inputs.len(), data.len()),
            ));
        }
        Ok(Embeddings {
            vectors: data.into_iter().map(|d| d.embedding).collect(),
            input_tokens: answer.usage.and_then(|u| u.prompt_tokens).unwrap_or(0),
        })
    }
}

impl Provider for OpenAiProvider {
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
        model: &'a str,
        inputs: &'a [String],
        cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<Embeddings, ProviderError>> {
        Box::pin(self.http.run(cancel, self.embed_once(model, inputs)))
    }
}

/// The Chat Completions request, serialized straight from the call's own data (borrowed,
/// no intermediate JSON tree).
#[derive(Serialize)]
struct OutRequest<'a> {
    model: &'a str,
    messages: Vec<OutMessage<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<OutTool<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream_options: Option<StreamOptions>,
}

#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
}

#[derive(Serialize)]
#[serde(tag = "role", rename_all = "lowercase")]
enum OutMessage<'a> {
    System {
        content: &'a str,
    },
    User {
        content: &'a str,
    },
    Assistant {
        /// None (JSON null) for a message that only calls tools.
        content: Option<&'a str>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<OutToolCall<'a>>,
    },
    Tool {
        tool_call_id: &'a str,
        content: &'a str,
    },
}

#[derive(Serialize)]
struct OutToolCall<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: OutFunctionCall<'a>,
}

#[derive(Serialize)]
struct OutFunctionCall<'a> {
    name: &'a str,
    arguments: String,
}

#[derive(Serialize)]
struct OutTool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    function: OutFunction<'a>,
}

#[derive(Serialize)]
struct OutFunction<'a> {
    name: &'a str,
    description: &'a str,
    parameters: &'a Value,
}

fn request_body(req: &ChatRequest, stream: bool) -> OutRequest<'_> {
    let mut messages = Vec::with_capacity(req.messages.len() + 1);
    if let Some(system) = req.system.as_deref().filter(|s| !s.is_empty()) {
        messages.push(OutMessage::System { content: system });
    }
    messages.extend(req.messages.iter().map(wire_message));
    OutRequest {
        model: &req.model,
        messages,
        tools: req
            .tools
            .iter()
            .map(|tool| OutTool {
                kind: "function",
                function: OutFunction {
                    name: &tool.name,
                    description: &tool.description,
                    parameters: &tool.parameters,
                },
            })
            .collect(),
        max_tokens: req.max_tokens,
        temperature: req.temperature,
        stream,
        stream_options: stream.then_some(StreamOptions {
            include_usage: true,
        }),
    }
}

fn wire_message(message: &ChatMessage) -> OutMessage<'_> {
    match message.role {
        Role::User => OutMessage::User {
            content: &message.content,
        },
        Role::Assistant => OutMessage::Assistant {
            content: (!message.content.is_empty() || message.tool_calls.is_empty())
                .then_some(message.content.as_str()),
            tool_calls: message
                .tool_calls
                .iter()
                .map(|call| OutToolCall {
                    id: &call.id,
                    kind: "function",
                    function: OutFunctionCall {
                        name: &call.name,
                        arguments: arguments_string(&call.arguments),
                    },
                })
                .collect(),
        },
        Role::Tool => OutMessage::Tool {
            tool_call_id: message.tool_call_id.as_deref().unwrap_or_default(),
            content: &message.content,
        },
    }
}

/// Arguments as the API carries them: a JSON string. A string kept because the model's
/// arguments were not JSON goes back verbatim.
fn arguments_string(arguments: &Value) -> String {
    match arguments {
        Value::String(raw) => raw.clone(),
        other => other.to_string(),
    }
}

fn tool_call(id: Option<String>, name: Option<String>, arguments: Option<Value>) -> ToolCall {
    let arguments = match arguments {
        Some(Value::String(raw)) => client::parse_arguments(&raw),
        Some(Value::Null) | None => Value::Object(Map::new()),
        Some(other) => other,
    };
    ToolCall {
        id: id
            .filter(|id| !id.is_empty())
            .unwrap_or_else(client::new_call_id),
        name: name.unwrap_or_default(),
        arguments,
    }
}

/// Message content: a string, or an array of parts whose texts are joined.
fn content_text(content: Option<Value>) -> String {
    match content {
        Some(Value::String(text)) => text,
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|part| part.get("text").and_then(Value::as_str))
            .collect(),
        _ => String::new(),
    }
}

fn stop_reason(finish_reason: Option<&str>, has_tool_calls: bool) -> StopReason {
    if has_tool_calls {
        return StopReason::ToolCalls;
    }
    match finish_reason {
        Some("length") => StopReason::Length,
        // "tool_calls"/"function_call" without any call, "stop", "content_filter", none
        _ => StopReason::Stop,
    }
}

#[derive(Debug, Default)]
struct PartialCall {
    id: String,
    name: String,
    arguments: String,
}

#[derive(Debug, Default)]
struct StreamState {
    content: String,
    calls: BTreeMap<u32, PartialCall>,
    finish: Option<String>,
    usage: Option<Usage>,
    done: bool,
}

impl StreamState {
    fn apply(&mut self, chunk: Chunk, sink: &DeltaSink) {
        if let Some(usage) = chunk.usage {
            self.usage = Some(usage.into());
        }
        // Only the first choice is followed (n is never set above 1).
        let Some(choice) = chunk
            .choices
            .into_iter()
            .find(|c| c.index.unwrap_or(0) == 0)
        else {
            return;
        };
        if let Some(reason) = choice.finish_reason.filter(|r| !r.is_empty()) {
            self.finish = Some(reason);
        }
        let Some(delta) = choice.delta else { return };
        if let Some(text) = delta.content.filter(|t| !t.is_empty()) {
            self.content.push_str(&text);
            // A closed receiver is fine: the call still completes.
            let _ = sink.send(text);
        }
        for (position, piece) in delta.tool_calls.into_iter().enumerate() {
            let index = piece
                .index
                .unwrap_or_else(|| u32::try_from(position).unwrap_or(u32::MAX));
            let call = self.calls.entry(index).or_default();
            if let Some(id) = piece.id.filter(|id| !id.is_empty()) {
                if call.id.is_empty() {
                    call.id = id;
                }
            }
            let function = piece.function.unwrap_or_default();
            if let Some(name) = function.name.filter(|n| !n.is_empty()) {
                if call.name.is_empty() {
                    call.name = name;
                }
            }
            if let Some(arguments) = function.arguments {
                call.arguments.push_str(&arguments);
            }
        }
    }

    fn into_response(self) -> ChatResponse {
        let tool_calls: Vec<ToolCall> = self
            .calls
            .into_values()
            .map(|call| {
                tool_call(
                    Some(call.id),
                    Some(call.name),
                    Some(Value::String(call.arguments)),
                )
            })
            .collect();
        ChatResponse {
            content: self.content,
            stop: stop_reason(self.finish.as_deref(), !tool_calls.is_empty()),
            tool_calls,
            usage: self.usage.unwrap_or_default(),
        }
    }
}

// ---- wire types (lenient: unknown fields ignored, nulls tolerated) ----

#[derive(Debug, Deserialize)]
struct Completion {
    #[serde(default, deserialize_with = "null_default")]
    choices: Vec<Choice>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct Choice {
    #[serde(default)]
    message: Option<WireMessage>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct WireMessage {
    #[serde(default)]
    content: Option<Value>,
    #[serde(default, deserialize_with = "null_default")]
    tool_calls: Vec<WireToolCall>,
    #[serde(default)]
    function_call: Option<WireFunction>,
}

#[derive(Debug, Deserialize)]
struct WireToolCall {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<WireFunction>,
}

#[derive(Debug, Default, Deserialize)]
struct WireFunction {
    #[serde(default)]
    name: Option<String>,
    /// A JSON string normally; some servers send the object itself.
    #[serde(default)]
    arguments: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    prompt_tokens_details: Option<PromptDetails>,
}

#[derive(Debug, Deserialize)]
struct PromptDetails {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

impl From<WireUsage> for Usage {
    fn from(usage: WireUsage) -> Self {
        Self {
            input: usage.prompt_tokens.unwrap_or(0),
            output: usage.completion_tokens.unwrap_or(0),
            cached_input: usage
                .prompt_tokens_details
                .and_then(|d| d.cached_tokens)
                .unwrap_or(0),
            cache_write: 0,
        }
    }
}

#[derive(Debug, Deserialize)]
struct Chunk {
    #[serde(default, deserialize_with = "null_default")]
    choices: Vec<ChunkChoice>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct ChunkChoice {
    #[serde(default)]
    index: Option<u32>,
    #[serde(default)]
    delta: Option<Delta>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Delta {
    #[serde(default)]
    content: Option<String>,
    #[serde(default, deserialize_with = "null_default")]
    tool_calls: Vec<DeltaToolCall>,
}

#[derive(Debug, Deserialize)]
struct DeltaToolCall {
    #[serde(default)]
    index: Option<u32>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<DeltaFunction>,
}

#[derive(Debug, Default, Deserialize)]
struct DeltaFunction {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<String>,
}

#[derive(Debug, Deserialize)]
struct EmbeddingAnswer {
    #[serde(default, deserialize_with = "null_default")]
    data: Vec<EmbeddingItem>,
    #[serde(default)]
    usage: Option<EmbeddingUsage>,
}

#[derive(Debug, Deserialize)]
struct EmbeddingItem {
    #[serde(default)]
    index: u64,
    embedding: Vec<f32>,
}

#[derive(Debug, Deserialize)]
struct EmbeddingUsage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::ToolSpec;

    #[test]
    fn body_carries_system_tools_and_tool_turns() {
        let call = ToolCall {
            id: "call_1".into(),
            name: "lookup".into(),
            arguments: json!({"q": "x"}),
        };
        let req = ChatRequest {
            model: "gpt-test".into(),
            system: Some("be brief".into()),
            messages: vec![
                ChatMessage::user("hi"),
                ChatMessage::assistant("", vec![call.clone()]),
                ChatMessage::tool(&call, "result", false),
            ],
            tools: vec![ToolSpec {
                name: "lookup".into(),
                description: "find".into(),
                parameters: json!({"type": "object"}),
            }],
            max_tokens: Some(10),
            temperature: None,
        };
        let body = serde_json::to_value(request_body(&req, false)).unwrap();
        assert_eq!(
            body["messages"][0],
            json!({"role": "system", "content": "be brief"})
        );
        assert_eq!(
            body["messages"][2]["tool_calls"][0]["function"]["arguments"],
            json!("{\"q\":\"x\"}")
        );
        assert_eq!(body["messages"][2]["content"], Value::Null);
        assert_eq!(
            body["messages"][3],
            json!({"role": "tool", "tool_call_id": "call_1", "content": "result"})
        );
        assert_eq!(body["tools"][0]["function"]["name"], json!("lookup"));
        assert_eq!(body["max_tokens"], json!(10));
        assert!(body.get("temperature").is_none());
        assert!(body.get("stream").is_none());
    }

    #[test]
    fn streaming_body_asks_for_usage_and_sends_numbers_as_given() {
        let req = ChatRequest {
            model: "m".into(),
            system: Some(String::new()),
            messages: vec![
                ChatMessage::user("hi"),
                ChatMessage::assistant("", Vec::new()),
            ],
            tools: Vec::new(),
            max_tokens: None,
            temperature: Some(0.7),
        };
        assert_eq!(
            serde_json::to_string(&request_body(&req, true)).unwrap(),
            r#"{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":""}],"temperature":0.7,"stream":true,"stream_options":{"include_usage":true}}"#
        );
    }

    #[test]
    fn non_json_arguments_round_trip_verbatim() {
        assert_eq!(arguments_string(&Value::String("{bad".into())), "{bad");
        assert_eq!(arguments_string(&json!({"a": 1})), "{\"a\":1}");
    }

    #[test]
    fn stop_reasons() {
        assert_eq!(stop_reason(Some("stop"), false), StopReason::Stop);
        assert_eq!(stop_reason(Some("length"), false), StopReason::Length);
        assert_eq!(stop_reason(Some("stop"), true), StopReason::ToolCalls);
        assert_eq!(stop_reason(Some("tool_calls"), true), StopReason::ToolCalls);
        assert_eq!(stop_reason(None, false), StopReason::Stop);
    }

    #[test]
    fn missing_ids_are_generated() {
        let call = tool_call(None, Some("f".into()), Some(json!("{\"a\":1}")));
        assert!(call.id.starts_with("call_"));
        assert_eq!(call.arguments, json!({"a": 1}));
        let call = tool_call(Some(String::new()), Some("f".into()), Some(json!({"b": 2})));
        assert!(call.id.starts_with("call_"));
        assert_eq!(call.arguments, json!({"b": 2}));
    }
}
