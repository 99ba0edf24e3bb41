//! `POST /v1/responses`: the OpenAI Responses format over the same ephemeral turn as chat
//! completions. The answer is one `message` output item with one `output_text` part; the
//! stream is the Responses event sequence, each event carrying `type` and `sequence_number`.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use poem::{IntoResponse, Response};
use poem_openapi::payload::{Json, Payload};
use poem_openapi::registry::{MetaMediaType, MetaResponse, MetaResponses, Registry};
use poem_openapi::types::Any;
use poem_openapi::{ApiResponse, Object};

use crate::http::either::either;
use serde_json::{json, Value};

use super::chat::turn_for;
use crate::api::generated::types::FinishReason;
use crate::api::principal::Principal;
use crate::app::state::AppState;
use crate::http::sse::{self, Sse};
use crate::http::turns::{run_to_end, Render, StreamingTurn};
use crate::runtime::turn::TurnOutcome;
use crate::transport::problem::{Problem, V1Error};

/// A content part of an input message: `input_text` (or `output_text` for earlier answers).
#[derive(Debug, Clone, PartialEq, Object, serde::Serialize)]
#[oai(rename = "ResponsesInputPart")]
pub struct InputPart {
    #[oai(rename = "type")]
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

either! {
    /// A string, or an array of parts.
    InputContent as "ResponsesInputContent" { Text(String), Parts(Vec<InputPart>) }
}

/// An input message.
#[derive(Debug, Clone, PartialEq, Object, serde::Serialize)]
#[oai(rename = "ResponsesInputMessage")]
pub struct InputMessage {
    /// `message` when given.
    #[oai(rename = "type")]
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// `user`, `system`, `developer` or `assistant`.
    pub role: String,
    pub content: InputContent,
}

either! {
    /// A string (the user's message), or a list of messages.
    Input as "ResponsesInput" { Text(String), Messages(Vec<InputMessage>) }
}

/// `POST /v1/responses`.
#[derive(Debug, Clone, Object)]
#[oai(rename = "ResponsesRequest", deny_unknown_fields)]
pub struct ResponsesRequest {
    /// `<provider>/<model>`, a bare model id, an alias, or an agent id.
    #[oai(validator(min_length = 1))]
    pub model: String,
    pub input: Input,
    /// The system prompt (joined with system/developer messages of `input`).
    pub instructions: Option<String>,
    pub stream: Option<bool>,
    #[oai(validator(minimum(value = "1"), maximum(value = "4294967295")))]
    pub max_output_tokens: Option<u64>,
    #[oai(validator(minimum(value = "0"), maximum(value = "2")))]
    pub temperature: Option<f64>,
    /// Accepted; responses are never stored (each request is ephemeral).
    pub store: Option<bool>,
    /// Echoed back on the response.
    pub metadata: Option<HashMap<String, String>>,
    /// Accepted and ignored.
    pub user: Option<String>,
}

/// A Responses answer: JSON, or an event stream.
pub enum ResponsesResponse {
    Json(Json<Any<Value>>),
    Stream(Sse<Any<Value>>),
}

impl IntoResponse for ResponsesResponse {
    fn into_response(self) -> Response {
        match self {
            Self::Json(j) => j.into_response(),
            Self::Stream(s) => s.into_response(),
        }
    }
}

impl ApiResponse for ResponsesResponse {
    fn meta() -> MetaResponses {
        MetaResponses {
            responses: vec![MetaResponse {
                description:
                    "The response object (JSON), or with `stream: true` the Responses event stream",
                status: Some(200),
                status_range: None,
                content: vec![
                    MetaMediaType {
                        content_type: "application/json; charset=utf-8",
                        schema: Json::<Any<Value>>::schema_ref(),
                    },
                    MetaMediaType {
                        content_type: "text/event-stream",
                        schema: Sse::<Any<Value>>::schema_ref(),
                    },
                ],
                headers: vec![],
            }],
        }
    }

    fn register(_registry: &mut Registry) {}
}

fn part_text(content: &InputContent, at: usize) -> Result<String, Problem> {
    match content {
        InputContent::Text(t) => Ok(t.clone()),
        InputContent::Parts(parts) => {
            let mut out = Vec::new();
            for (j, p) in parts.iter().enumerate() {
                let param = format!("input[{at}].content[{j}]");
                match (p.kind.as_str(), &p.text) {
                    ("input_text" | "output_text" | "text", Some(t)) => out.push(t.as_str()),
                    ("input_image", _) => {
                        return Err(Problem::invalid_param(
                            &param,
                            "Vision input (input_image parts) is not supported on this endpoint",
                        ))
                    }
                    (kind, _) => {
                        return Err(Problem::invalid_param(
                            &param,
                            format!("Unsupported content part '{kind}': only input_text parts with 'text' are accepted"),
                        ))
                    }
                }
            }
            Ok(out.join("\n"))
        }
    }
}

fn prompt_of(req: &ResponsesRequest) -> Result<(Option<String>, String), Problem> {
    let mut system: Vec<String> = req.instructions.iter().cloned().collect();
    let input = match &req.input {
        Input::Text(t) => Some(t.clone()),
        Input::Messages(items) => {
            let mut last = None;
            for (i, m) in items.iter().enumerate() {
                if m.kind.as_deref().is_some_and(|k| k != "message") {
                    return Err(Problem::invalid_param(
                        &format!("input[{i}].type"),
                        "Only message input items are supported",
                    ));
                }
                let text = part_text(&m.content, i)?;
                match m.role.as_str() {
                    "system" | "developer" => system.push(text),
                    "user" => last = Some(text),
                    "assistant" => {}
                    other => {
                        return Err(Problem::invalid_param(
                            &format!("input[{i}].role"),
                            format!("Unknown role '{other}'"),
                        ))
                    }
                }
            }
            last
        }
    };
    let input = input
        .ok_or_else(|| Problem::invalid_param("input", "'input' must contain a user message"))?;
    Ok(((!system.is_empty()).then(|| system.join("\n")), input))
}

/// Builds the response object at each stage of its life.
struct Shape {
    id: String,
    message_id: String,
    created_at: i64,
    model: String,
    instructions: Option<String>,
    max_output_tokens: Option<u64>,
    temperature: Option<f64>,
    metadata: HashMap<String, String>,
}

impl Shape {
    fn message(&self, text: &str, done: bool) -> Value {
        let content = if done {
            json!([{"type": "output_text", "text": text, "annotations": []}])
        } else {
            json!([])
        };
        json!({
            "id": self.message_id,
            "type": "message",
            "status": if done { "completed" } else { "in_progress" },
            "role": "assistant",
            "content": content,
        })
    }

    fn response(&self, outcome: Option<&TurnOutcome>) -> Value {
        let (status, output, usage, incomplete) = match outcome {
            None => ("in_progress", json!([]), Value::Null, Value::Null),
            Some(o) => {
                let incomplete = o.finish == FinishReason::MaxSteps;
                (
                    if incomplete {
                        "incomplete"
                    } else {
                        "completed"
                    },
                    json!([self.message(&o.response, true)]),
                    json!({
                        "input_tokens": o.input_tokens,
                        "input_tokens_details": {"cached_tokens": 0},
                        "output_tokens": o.output_tokens,
                        "output_tokens_details": {"reasoning_tokens": 0},
                        "total_tokens": o.input_tokens + o.output_tokens,
                    }),
                    if incomplete {
                        json!({"reason": "max_output_tokens"})
                    } else {
                        Value::Null
                    },
                )
            }
        };
        json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": null,
            "incomplete_details": incomplete,
            "instructions": self.instructions,
            "max_output_tokens": self.max_output_tokens,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": false,
            "previous_response_id": null,
            "store": false,
            "temperature": self.temperature,
            "text": {"format": {"type": "text"}},
            "tool_choice": "none",
            "tools": [],
            "top_p": null,
            "truncation": "disabled",
            "usage": usage,
            "metadata": self.metadata,
        })
    }
}

/// Numbers the events of one stream.
struct Events {
    seq: u64,
}

impl Events {
    fn frame(&mut self, kind: &str, mut body: Value) -> Bytes {
        if let Value::Object(m) = &mut body {
            m.insert("type".to_owned(), json!(kind));
            m.insert("sequence_number".to_owned(), json!(self.seq));
        }
        self.seq += 1;
        sse::frame(Some(kind), &body.to_string())
    }
}

pub async fn create(
    state: &Arc<AppState>,
    principal: &Principal,
    req: ResponsesRequest,
) -> Result<ResponsesResponse, V1Error> {
    let (system, input) = prompt_of(&req)?;
    let id = format!("resp_{}", crate::clock::ordered_id().simple());
    let mut turn = turn_for(state, principal, &req.model, &id, system, input)?;
    turn.temperature = req.temperature;
    turn.max_tokens = req
        .max_output_tokens
        .map(|t| t.min(u64::from(u32::MAX)) as u32);
    let shape = Shape {
        message_id: format!("msg_{}", crate::clock::ordered_id().simple()),
        id,
        created_at: chrono::Utc::now().timestamp(),
        model: req.model.clone(),
        instructions: req.instructions.clone(),
        max_output_tokens: req.max_output_tokens,
        temperature: req.temperature,
        metadata: req.metadata.clone().unwrap_or_default(),
    };
    if req.stream != Some(true) {
        let outcome = run_to_end(&state.engine, turn).await?;
        return Ok(ResponsesResponse::Json(Json(Any(
            shape.response(Some(&outcome))
        ))));
    }
    let started = StreamingTurn::begin(state.engine.clone(), turn).await?;
    let mut events = Events { seq: 0 };
    let mut opening = Vec::new();
    opening.extend_from_slice(&events.frame(
        "response.created",
        json!({"response": shape.response(None)}),
    ));
    opening.extend_from_slice(&events.frame(
        "response.in_progress",
        json!({"response": shape.response(None)}),
    ));
    opening.extend_from_slice(&events.frame(
        "response.output_item.added",
        json!({"output_index": 0, "item": shape.message("", false)}),
    ));
    opening.extend_from_slice(&events.frame(
        "response.content_part.added",
        json!({"item_id": shape.message_id, "output_index": 0, "content_index": 0,
               "part": {"type": "output_text", "text": "", "annotations": []}}),
    ));
    let opening = Bytes::from(opening);
    Ok(ResponsesResponse::Stream(Sse::new(
        started.frames(Some(opening), Streamed { shape, events }),
    )))
}

/// The Responses stream after its opening events.
struct Streamed {
    shape: Shape,
    events: Events,
}

impl Render for Streamed {
    fn delta(&mut self, delta: String) -> Bytes {
        self.events.frame(
            "response.output_text.delta",
            json!({"item_id": self.shape.message_id, "output_index": 0,
                   "content_index": 0, "delta": delta}),
        )
    }

    fn done(&mut self, result: Result<TurnOutcome, crate::api::error::GatewayError>) -> Bytes {
        closing(&self.shape, &mut self.events, result)
    }
}

fn closing(
    shape: &Shape,
    events: &mut Events,
    result: Result<TurnOutcome, crate::api::error::GatewayError>,
) -> Bytes {
    let outcome = match result {
        Ok(o) => o,
        Err(e) => {
            tracing::warn!(error = %e, "streamed response ended by an error");
            let mut failed = shape.response(None);
            failed["status"] = json!("failed");
            failed["error"] = json!({"code": "server_error", "message": "The turn failed"});
            return events.frame("response.failed", json!({"response": failed}));
        }
    };
    let text = outcome.response.as_str();
    let mut out = Vec::new();
    out.extend_from_slice(&events.frame(
        "response.output_text.done",
        json!({"item_id": shape.message_id, "output_index": 0, "content_index": 0, "text": text}),
    ));
    out.extend_from_slice(&events.frame(
        "response.content_part.done",
        json!({"item_id": shape.message_id, "output_index": 0, "content_index": 0,
               "part": {"type": "output_text", "text": text, "annotations": []}}),
    ));
    out.extend_from_slice(&events.frame(
        "response.output_item.done",
        json!({"output_index": 0, "item": shape.message(text, true)}),
    ));
    let last = if outcome.finish == FinishReason::MaxSteps {
        "response.incomplete"
    } else {
        "response.completed"
    };
    out.extend_from_slice(&events.frame(last, json!({"response": shape.response(Some(&outcome))})));
    Bytes::from(out)
}
