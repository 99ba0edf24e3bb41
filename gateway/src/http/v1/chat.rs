//! `POST /v1/chat/completions`: the request's messages become one ephemeral turn (system
//! messages the system prompt, the last user message the input), answered as JSON or as the
//! chunk stream of the spec's "Streaming sequence".

use std::sync::Arc;

use bytes::Bytes;
use poem::{IntoResponse, Response};
use poem_openapi::payload::{Json, Payload};
use poem_openapi::registry::{MetaMediaType, MetaResponse, MetaResponses, Registry};
use poem_openapi::types::Type;
use poem_openapi::ApiResponse;

use super::types::*;
use crate::api::principal::Principal;
use crate::app::state::AppState;
use crate::http::sse::{self, Sse};
use crate::http::turns::{openai_finish, resolve_target, run_to_end, Render, StreamingTurn};
use crate::runtime::turn::{TurnOutcome, TurnRequest};
use crate::store::sessions::session_key;
use crate::transport::problem::{Area, Problem, V1Error};

/// Channel and user labels of a compatible-API session (the peer is the completion id).
pub const V1_CHANNEL: &str = "openai";
pub const V1_USER: &str = "openai-user";

/// A chat completion: JSON, or an event stream of chunks.
pub enum ChatCompletionResponse {
    Json(Json<ChatCompletion>),
    Stream(Sse<ChatCompletionChunk>),
}

impl IntoResponse for ChatCompletionResponse {
    fn into_response(self) -> Response {
        match self {
            // Written straight from the typed value (poem-openapi's `Json` builds a JSON tree first).
            Self::Json(j) => match serde_json::to_vec(&j.0) {
                Ok(body) => Response::builder()
                    .content_type("application/json; charset=utf-8")
                    .body(body),
                Err(_) => Problem::internal().into_area_response(Area::V1),
            },
            Self::Stream(s) => s.into_response(),
        }
    }
}

impl ApiResponse for ChatCompletionResponse {
    fn meta() -> MetaResponses {
        MetaResponses {
            responses: vec![MetaResponse {
                description: "The completion (JSON), or with `stream: true` its chunks (SSE, ending with `data: [DONE]`)",
                status: Some(200),
                status_range: None,
                content: vec![
                    MetaMediaType {
                        content_type: "application/json; charset=utf-8",
                        schema: Json::<ChatCompletion>::schema_ref(),
                    },
                    MetaMediaType {
                        content_type: "text/event-stream",
                        schema: Sse::<ChatCompletionChunk>::schema_ref(),
                    },
                ],
                headers: vec![],
            }],
        }
    }

    fn register(registry: &mut Registry) {
        ChatCompletion::register(registry);
        ChatCompletionChunk::register(registry);
    }
}

/// The text of a message: a string, or its text blocks joined with newlines. Image blocks
/// are refused, never dropped.
pub fn content_text(content: &Content, at: usize) -> Result<String, Problem> {
    match content {
        Content::Text(t) => Ok(t.clone()),
        Content::Parts(parts) => {
            let mut texts = Vec::with_capacity(parts.len());
            for (j, p) in parts.iter().enumerate() {
                let param = format!("messages[{at}].content[{j}]");
                match (p.kind.as_str(), &p.text) {
                    ("text", Some(t)) => texts.push(t.as_str()),
                    ("text", None) => {
                        return Err(Problem::invalid_param(
                            &param,
                            format!("'{param}.text' is required for a text block"),
                        ))
                    }
                    ("image_url", _) => {
                        return Err(Problem::invalid_param(
                            &param,
                            "Vision input (image_url content blocks) is not supported on this endpoint",
                        ))
                    }
                    (other, _) => {
                        return Err(Problem::invalid_param(
                            &param,
                            format!("Unsupported content block type '{other}': only 'text' blocks are accepted"),
                        ))
                    }
                }
            }
            Ok(texts.join("\n"))
        }
    }
}

/// The system prompt (all system messages joined) and the input (the last user message).
fn prompt_of(messages: &[ChatMessageIn]) -> Result<(Option<String>, String), Problem> {
    let mut system = Vec::new();
    let mut input = None;
    for (i, m) in messages.iter().enumerate() {
        let text = content_text(&m.content, i)?;
        match m.role {
            Role::System => system.push(text),
            Role::User => input = Some(text),
            Role::Assistant => {}
        }
    }
    let input = input.ok_or_else(|| {
        Problem::invalid_param("messages", "'messages' must contain a user message")
    })?;
    Ok(((!system.is_empty()).then(|| system.join("\n")), input))
}

fn usage_of(o: &TurnOutcome) -> CompletionUsage {
    CompletionUsage {
        prompt_tokens: o.input_tokens,
        completion_tokens: o.output_tokens,
        total_tokens: o.input_tokens + o.output_tokens,
    }
}

/// Builds the turn a compatible request asks for: the agent and model `model` names, an
/// ephemeral session labelled with the completion id.
pub fn turn_for(
    state: &AppState,
    principal: &Principal,
    model: &str,
    completion_id: &str,
    system: Option<String>,
    input: String,
) -> Result<TurnRequest, Problem> {
    let target = resolve_target(&state.engine, model)
        .ok_or_else(|| Problem::not_found(format!("Model not found: {model}")))?;
    let label = session_key(&target.agent.id, V1_CHANNEL, completion_id, V1_USER);
    // A model (not an agent) was asked for: answer like that model, without the agent's tools.
    let only_tools = target
        .model
        .as_ref()
        .map(|_| std::collections::BTreeSet::new());
    let system = match &target.model {
        Some(_) => Some(system.unwrap_or_default()),
        None => system,
    };
    Ok(TurnRequest {
        model: target.model,
        only_tools,
        system,
        usage_label: Some(label),
        ..TurnRequest::new(target.agent, input, &principal.context(None))
    })
}

pub async fn complete(
    state: &Arc<AppState>,
    principal: &Principal,
    req: ChatCompletionRequest,
) -> Result<ChatCompletionResponse, V1Error> {
    let (system, input) = prompt_of(&req.messages)?;
    let id = format!("chatcmpl-{}", crate::clock::ordered_id());
    let mut turn = turn_for(state, principal, &req.model, &id, system, input)?;
    turn.temperature = req.temperature;
    turn.max_tokens = req.max_tokens.map(|t| t.min(u64::from(u32::MAX)) as u32);
    let created = chrono::Utc::now().timestamp();
    if req.stream != Some(true) {
        let outcome = run_to_end(&state.engine, turn).await?;
        return Ok(ChatCompletionResponse::Json(Json(ChatCompletion {
            id,
            object: "chat.completion".to_owned(),
            created,
            model: req.model,
            choices: vec![Choice {
                index: 0,
                message: AssistantMessage {
                    role: "assistant".to_owned(),
                    content: Some(outcome.response.clone()),
                },
                finish_reason: openai_finish(outcome.finish).to_owned(),
            }],
            usage: usage_of(&outcome),
        })));
    }
    let include_usage = req
        .stream_options
        .as_ref()
        .and_then(|o| o.include_usage)
        .unwrap_or(false);
    let started = StreamingTurn::begin(state.engine.clone(), turn).await?;
    let chunker = Chunker::new(id, created, req.model, include_usage);
    let opening = chunker.frame(
        Delta {
            role: Some("assistant".to_owned()),
            content: None,
        },
        None,
    );
    Ok(ChatCompletionResponse::Stream(Sse::new(
        started.frames(Some(opening), chunker),
    )))
}

/// Writes the chunks of one completion.
struct Chunker {
    id: String,
    created: i64,
    model: String,
    include_usage: bool,
    /// A content chunk's frame before and after its text: cut once from a serialized chunk
    /// whose text is a marker, so that each delta writes only its own text between them
    /// (byte for byte what serializing the whole chunk gives; see the test).
    content_frame: Option<(Vec<u8>, Vec<u8>)>,
}

/// The text of the template chunk; serialized, it is `"\u0001"`, which neither the chunk's
/// fields before the text nor those after it contain (those after it are fixed).
const MARKER: &str = "\u{1}";
const MARKER_JSON: &[u8] = b"\"\\u0001\"";

impl Render for Chunker {
    fn delta(&mut self, text: String) -> Bytes {
        let Some((head, tail)) = &self.content_frame else {
            return self.content(text);
        };
        let mut out = Vec::with_capacity(head.len() + text.len() + 8 + tail.len());
        out.extend_from_slice(head);
        if serde_json::to_writer(&mut out, &text).is_err() {
            return Bytes::new();
        }
        out.extend_from_slice(tail);
        Bytes::from(out)
    }

    fn done(&mut self, result: Result<TurnOutcome, crate::api::error::GatewayError>) -> Bytes {
        self.closing(result)
    }
}

impl Chunker {
    fn new(id: String, created: i64, model: String, include_usage: bool) -> Self {
        let mut chunker = Self {
            id,
            created,
            model,
            include_usage,
            content_frame: None,
        };
        let template = chunker.content(MARKER.to_owned());
        // The marker's last occurrence is the text (the fields after it are fixed).
        chunker.content_frame = template
            .windows(MARKER_JSON.len())
            .rposition(|w| w == MARKER_JSON)
            .and_then(|at| {
                let (head, rest) = template.split_at_checked(at)?;
                Some((head.to_vec(), rest.get(MARKER_JSON.len()..)?.to_vec()))
            });
        chunker
    }

    /// A content chunk serialized whole.
    fn content(&self, text: String) -> Bytes {
        self.frame(
            Delta {
                role: None,
                content: Some(text),
            },
            None,
        )
    }

    fn chunk(&self, choices: Vec<ChunkChoice>, usage: Option<CompletionUsage>) -> Bytes {
        let chunk = ChatCompletionChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk".to_owned(),
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
        };
        match serde_json::to_string(&chunk) {
            Ok(json) => sse::frame(None, &json),
            Err(_) => Bytes::new(),
        }
    }

    fn frame(&self, delta: Delta, finish: Option<&str>) -> Bytes {
        self.chunk(
            vec![ChunkChoice {
                index: 0,
                delta,
                finish_reason: finish.map(str::to_owned),
            }],
            None,
        )
    }

    /// The finish chunk, the usage chunk when asked for, and `[DONE]`, as one write.
    fn closing(&self, result: Result<TurnOutcome, crate::api::error::GatewayError>) -> Bytes {
        let include_usage = self.include_usage;
        let mut out = Vec::new();
        match result {
            Ok(o) => {
                if let Some(f) = o.failure {
                    // Text was streamed already: the stream ends like an answer (README, `/v1` errors).
                    tracing::warn!(
                        kind = f.kind.as_str(),
                        status = f.status,
                        "streamed completion ended by a model failure"
                    );
                }
                out.extend_from_slice(&self.frame(Delta::default(), Some(openai_finish(o.finish))));
                if include_usage {
                    out.extend_from_slice(&self.chunk(Vec::new(), Some(usage_of(&o))));
                }
            }
            Err(e) => {
                // The stream has started: the failure ends it with a stop and is logged.
                tracing::warn!(error = %e, "streamed completion ended by an error");
                out.extend_from_slice(&self.frame(Delta::default(), Some("stop")));
                if include_usage {
                    out.extend_from_slice(&self.chunk(
                        Vec::new(),
                        Some(CompletionUsage {
                            prompt_tokens: 0,
                            completion_tokens: 0,
                            total_tokens: 0,
                        }),
                    ));
                }
            }
        }
        out.extend_from_slice(&sse::frame(None, "[DONE]"));
        Bytes::from(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A content frame written around its text is byte for byte the chunk serialized whole,
    /// whatever the text and whatever the model's name (even one holding the marker).
    #[test]
    fn a_delta_frame_is_the_whole_chunk_serialized() {
        let models = ["up/model", "odd \"name\" \\ é", "has \u{1} the marker", ""];
        let texts = [
            "hello",
            "",
            "quote \" backslash \\ slash /",
            "line\nbreak\r\n",
            "\u{1}",
            "tab\t\u{7f}\u{0}",
            "é 漢字 😀",
        ];
        for model in models {
            let mut chunker = Chunker::new("chatcmpl-1".to_owned(), 17, model.to_owned(), true);
            assert!(chunker.content_frame.is_some(), "{model}");
            for text in texts {
                let whole = chunker.content(text.to_owned());
                assert_eq!(chunker.delta(text.to_owned()), whole, "{model:?} {text:?}");
            }
        }
    }
}
