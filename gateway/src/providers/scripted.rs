//! The scripted provider: deterministic replies, tool calls and errors described in
//! configuration (tests, demos, benchmarks). No model, no network.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use super::{
    BoxFuture, ChatRequest, ChatResponse, DeltaSink, Embeddings, ErrorKind, Provider,
    ProviderError, Role, StopReason, ToolCall, Usage,
};
use crate::config::agents::{ScriptRule, ScriptStep};

/// Dimensions of the scripted embeddings.
pub const EMBEDDING_DIMS: usize = 16;

pub struct ScriptedProvider {
    rules: Vec<ScriptRule>,
    /// Failures answered so far per (rule, step), for `failTimes`.
    failures: Mutex<HashMap<(usize, usize), i64>>,
}

use super::tokens::estimate_tokens;

impl ScriptedProvider {
    pub fn new(rules: Vec<ScriptRule>) -> Self {
        Self {
            rules,
            failures: Mutex::new(HashMap::new()),
        }
    }

    /// The rule and step answering this request: the step index is the number of assistant
    /// messages after the latest user message.
    fn pick(&self, req: &ChatRequest) -> Option<(usize, usize, &ScriptStep)> {
        let last_user = req.messages.iter().rposition(|m| m.role == Role::User);
        let text = last_user.map_or("", |i| req.messages[i].content.as_str());
        let step = last_user.map_or(0, |i| {
            req.messages[i..]
                .iter()
                .filter(|m| m.role == Role::Assistant)
                .count()
        });
        self.rules.iter().enumerate().find_map(|(ri, r)| {
            let hit = r.match_.as_deref().is_none_or(|m| text.contains(m));
            let last = r.steps.len().checked_sub(1)?;
            let si = step.min(last);
            hit.then(|| (ri, si, &r.steps[si]))
        })
    }

    fn should_fail(&self, rule: usize, step: usize, s: &ScriptStep) -> bool {
        if s.error.is_none() {
            return false;
        }
        let Some(times) = s.fail_times else {
            return true;
        };
        let Ok(mut f) = self.failures.lock() else {
            return true;
        };
        let n = f.entry((rule, step)).or_insert(0);
        if *n < times {
            *n += 1;
            true
        } else {
            false
        }
    }
}

fn prompt_tokens(req: &ChatRequest) -> u64 {
    let mut n = req.system.as_deref().map_or(0, estimate_tokens);
    for m in &req.messages {
        n += estimate_tokens(&m.content) + 4;
        for c in &m.tool_calls {
            n += estimate_tokens(&c.name) + estimate_tokens(&c.arguments.to_string());
        }
    }
    n
}

impl Provider for ScriptedProvider {
    fn chat<'a>(
        &'a self,
        req: &'a ChatRequest,
        sink: Option<&'a DeltaSink>,
        cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<ChatResponse, ProviderError>> {
        Box::pin(async move {
            let picked = self.pick(req);
            if let Some(ms) = picked.and_then(|(_, _, s)| s.delay_ms).filter(|ms| *ms > 0) {
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(ms as u64)) => {}
                    () = cancel.cancelled() => {
                        return Err(ProviderError::new(ErrorKind::Cancelled, "cancelled"));
                    }
                }
            }
            let (reply, calls, usage) = match picked {
                Some((ri, si, step)) => {
                    if self.should_fail(ri, si, step) {
                        if let Some(e) = &step.error {
                            let msg = e
                                .message
                                .clone()
                                .unwrap_or_else(|| format!("scripted failure {}", e.status));
                            return Err(ProviderError::from_status(e.status as u16, msg));
                        }
                    }
                    let calls: Vec<ToolCall> = step
                        .tool_calls
                        .iter()
                        .flatten()
                        .map(|c| ToolCall {
                            id: format!("call_{}", uuid::Uuid::new_v4().simple()),
                            name: c.name.clone(),
                            arguments: c.arguments.clone().unwrap_or_else(|| serde_json::json!({})),
                        })
                        .collect();
                    (
                        step.reply.clone().unwrap_or_default(),
                        calls,
                        step.usage.clone(),
                    )
                }
                None => {
                    let text = req
                        .messages
                        .iter()
                        .rev()
                        .find(|m| m.role == Role::User)
                        .map_or("", |m| m.content.as_str());
                    (format!("You said: {text}"), Vec::new(), None)
                }
            };
            if let Some(sink) = sink {
                for piece in reply.split_inclusive(' ') {
                    if cancel.is_cancelled() {
                        return Err(ProviderError::new(ErrorKind::Cancelled, "cancelled"));
                    }
                    let _ = sink.send(piece.to_owned());
                }
            }
            let usage = match usage {
                Some(u) => Usage {
                    input: u.input.max(0) as u64,
                    output: u.output.max(0) as u64,
                    cached_input: u.cached.unwrap_or(0).max(0) as u64,
                    cache_write: 0,
                },
                None => Usage {
                    input: prompt_tokens(req),
                    output: estimate_tokens(&reply)
                        + calls
                            .iter()
                            .map(|c| estimate_tokens(&c.arguments.to_string()) + 1)
                            .sum::<u64>(),
                    ..Usage::default()
                },
            };
            let stop = if calls.is_empty() {
                StopReason::Stop
            } else {
                StopReason::ToolCalls
            };
            Ok(ChatResponse {
                content: reply,
                tool_calls: calls,
                usage,
                stop,
            })
        })
    }

    fn embed<'a>(
        &'a self,
        _model: &'a str,
        inputs: &'a [String],
        _cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<Embeddings, ProviderError>> {
        Box::pin(async move {
            let vectors = inputs.iter().map(|t| hash_vector(t)).collect();
            let input_tokens = inputs.iter().map(|t| estimate_tokens(t)).sum();
            Ok(Embeddings {
                vectors,
                input_tokens,
            })
        })
    }
}

/// A deterministic unit vector derived from the text's SHA-256.
fn hash_vector(text: &str) -> Vec<f32> {
    let digest = Sha256::digest(text.as_bytes());
    let raw: Vec<f32> = digest
        .chunks(2)
        .take(EMBEDDING_DIMS)
        .map(|c| f32::from(u16::from_be_bytes([c[0], c.get(1).copied().unwrap_or(0)])) - 32768.0)
        .collect();
    let norm = raw
        .iter()
        .map(|v| v * v)
        .sum::<f32>()
        .sqrt()
        .max(f32::EPSILON);
    raw.into_iter().map(|v| v / norm).collect()
}
