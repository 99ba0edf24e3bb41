//! `session_note_add` and `session_notes`: notes the agent keeps within one conversation.

use serde_json::{json, Value};

use super::{Tool, ToolContext, ToolResult};
use crate::providers::BoxFuture;

pub struct NoteAdd;
pub struct NotesList;

const NO_SESSION: &str = "this conversation is not stored, so it cannot keep notes";

impl Tool for NoteAdd {
    fn name(&self) -> &'static str {
        "session_note_add"
    }

    fn description(&self) -> &'static str {
        "Adds a note to the current conversation (kept until the session is reset or deleted)."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "note": {"type": "string", "minLength": 1, "maxLength": 10000, "description": "The note."}
            },
            "required": ["note"],
            "additionalProperties": false
        })
    }

    fn call<'a>(&'a self, ctx: &'a ToolContext<'a>, args: &'a Value) -> BoxFuture<'a, ToolResult> {
        Box::pin(async move {
            let key = ctx.session_key.ok_or_else(|| NO_SESSION.to_owned())?;
            let note = args.get("note").and_then(Value::as_str).unwrap_or_default();
            let id = ctx.store.note_add(key, note).await.map_err(|e| {
                tracing::error!(error = %e, "session_note_add failed");
                "the note could not be stored".to_owned()
            })?;
            Ok(json!({"added": true, "id": id}).to_string())
        })
    }
}

impl Tool for NotesList {
    fn name(&self) -> &'static str {
        "session_notes"
    }

    fn description(&self) -> &'static str {
        "Lists the notes of the current conversation, oldest first."
    }

    fn parameters(&self) -> Value {
        json!({"type": "object", "properties": {}, "additionalProperties": false})
    }

    fn call<'a>(&'a self, ctx: &'a ToolContext<'a>, _args: &'a Value) -> BoxFuture<'a, ToolResult> {
        Box::pin(async move {
            let key = ctx.session_key.ok_or_else(|| NO_SESSION.to_owned())?;
            let notes = ctx.store.notes_list(key).await.map_err(|e| {
                tracing::error!(error = %e, "session_notes failed");
                "the notes could not be read".to_owned()
            })?;
            let notes: Vec<Value> = notes
                .into_iter()
                .map(|n| json!({"id": n.id, "note": n.note, "createdAt": n.created_at}))
                .collect();
            Ok(json!({"notes": notes}).to_string())
        })
    }
}
