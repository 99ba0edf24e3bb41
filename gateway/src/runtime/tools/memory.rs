//! `memory_store` and `memory_search`: what the agent remembers across sessions, in its
//! tenant's memory (the same entries and hybrid recall as `memory.*`).

use serde_json::{json, Value};

use super::{Tool, ToolContext, ToolResult};
use crate::api::error::GatewayError;
use crate::providers::BoxFuture;
use crate::runtime::memory::recall::RecallFor;
use crate::runtime::memory::write::Source;
use crate::store::memory::NewMemory;

pub struct MemoryStore;
pub struct MemorySearch;

impl Tool for MemoryStore {
    fn name(&self) -> &'static str {
        "memory_store"
    }

    fn description(&self) -> &'static str {
        "Stores a fact to remember in later conversations. Returns the memory id."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "content": {"type": "string", "minLength": 1, "maxLength": 10000, "description": "The fact to remember."},
                "tags": {"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": 64}, "maxItems": 16, "description": "Labels for the fact."}
            },
            "required": ["content"],
            "additionalProperties": false
        })
    }

    fn call<'a>(&'a self, ctx: &'a ToolContext<'a>, args: &'a Value) -> BoxFuture<'a, ToolResult> {
        Box::pin(async move {
            let content = args
                .get("content")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let tags: Vec<String> = args
                .get("tags")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|t| t.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default();
            // Text an agent learned in a conversation fed by outside content (webhooks) is
            // never trusted more than that content.
            let trust = if ctx
                .session_key
                .is_some_and(|k| k.split(':').nth(2) == Some("webhook"))
            {
                "external"
            } else {
                "learned"
            };
            let written = ctx
                .memory
                .write(
                    ctx.owner,
                    NewMemory {
                        agent_id: ctx.agent_id,
                        session_key: ctx.session_key,
                        content,
                        tags: &tags,
                        memory_type: "semantic",
                        trust_level: trust,
                        pinned: false,
                        created_at: crate::clock::now_ms(),
                    },
                    Source::Agent,
                )
                .await;
            let id = match written {
                Ok((id, _)) => id,
                Err(GatewayError::InvalidParams(m)) => return Err(m),
                Err(e) => {
                    tracing::error!(error = %e, "memory_store failed");
                    return Err("the memory could not be stored".to_owned());
                }
            };
            Ok(json!({"stored": true, "id": id}).to_string())
        })
    }
}

impl Tool for MemorySearch {
    fn name(&self) -> &'static str {
        "memory_search"
    }

    fn description(&self) -> &'static str {
        "Searches the facts stored with memory_store; best matches first."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "query": {"type": "string", "minLength": 1, "maxLength": 1000, "description": "What to look for (words or a description)."},
                "limit": {"type": "integer", "minimum": 1, "maximum": 50, "description": "Most results (default 5)."}
            },
            "required": ["query"],
            "additionalProperties": false
        })
    }

    fn call<'a>(&'a self, ctx: &'a ToolContext<'a>, args: &'a Value) -> BoxFuture<'a, ToolResult> {
        Box::pin(async move {
            let query = args
                .get("query")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let limit = args.get("limit").and_then(Value::as_i64).unwrap_or(5);
            // The turn's tenant only (never every tenant, even for an admin caller), this
            // agent's entries only.
            let recall = ctx
                .memory
                .recall(
                    ctx.owner,
                    query,
                    limit.clamp(1, 50) as usize,
                    RecallFor {
                        agent: Some(ctx.agent_id),
                        session_key: ctx.session_key,
                        trace_id: Some(ctx.trace_id),
                    },
                )
                .await
                .map_err(|e| {
                    tracing::error!(error = %e, "memory_search failed");
                    "the memory search failed".to_owned()
                })?;
            let results: Vec<Value> = recall
                .hits
                .into_iter()
                .map(|h| {
                    json!({
                        "id": h.row.id.to_string(),
                        "content": h.row.content,
                        "tags": h.row.tags,
                        "trustLevel": h.row.trust_level,
                        "score": h.score,
                        "createdAt": h.row.created_at,
                    })
                })
                .collect();
            Ok(json!({"results": results}).to_string())
        })
    }
}
