//! `memory_store` and `memory_search`: what the agent remembers across sessions (SQLite FTS5).

use serde_json::{json, Value};

use super::{Tool, ToolContext, ToolResult};
use crate::runtime::providers::BoxFuture;

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
            let id = ctx
                .store
                .memory_insert(ctx.owner, ctx.agent_id, ctx.session_key, content, &tags)
                .await
                .map_err(|e| {
                    tracing::error!(error = %e, "memory_store failed");
                    "the memory could not be stored".to_owned()
                })?;
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
                "query": {"type": "string", "minLength": 1, "maxLength": 1000, "description": "Words to look for."},
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
            let hits = ctx
                .store
                .search_memories(ctx.tenant, Some(ctx.agent_id), query, limit)
                .await
                .map_err(|e| {
                    tracing::error!(error = %e, "memory_search failed");
                    "the memory search failed".to_owned()
                })?;
            let results: Vec<Value> = hits
                .into_iter()
                .map(|h| {
                    json!({
                        "id": h.id,
                        "content": h.content,
                        "tags": serde_json::from_str::<Value>(&h.tags).unwrap_or(Value::Null),
                        "score": h.score,
                        "createdAt": h.created_at,
                    })
                })
                .collect();
            Ok(json!({"results": results}).to_string())
        })
    }
}
