//! `save_file`: saves text the agent wrote (a report, a CSV, a snippet) to the media store,
//! served at `/media/<id>`.

use serde_json::{json, Value};

use super::{Tool, ToolContext, ToolResult};
use crate::providers::BoxFuture;

/// Longest content the tool accepts, in bytes (the store has its own, larger, limit).
pub const MAX_CONTENT_BYTES: usize = 1 << 20;

pub struct SaveFile;

impl Tool for SaveFile {
    fn name(&self) -> &'static str {
        "save_file"
    }

    fn description(&self) -> &'static str {
        "Saves text as a file the user can download. Returns the file's id and its URL path \
         (/media/<id>)."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "fileName": {"type": "string", "minLength": 1, "maxLength": 200,
                             "description": "Name with an extension, e.g. report.md"},
                "content": {"type": "string", "maxLength": MAX_CONTENT_BYTES,
                            "description": "The file's text"},
                "contentType": {"type": "string", "maxLength": 200,
                                "description": "MIME type; default: from the extension"}
            },
            "required": ["fileName", "content"],
            "additionalProperties": false
        })
    }

    fn call<'a>(&'a self, ctx: &'a ToolContext<'a>, args: &'a Value) -> BoxFuture<'a, ToolResult> {
        Box::pin(async move {
            let name = args["fileName"].as_str().unwrap_or_default();
            let content = args["content"].as_str().unwrap_or_default();
            if content.len() > MAX_CONTENT_BYTES {
                return Err(format!("content exceeds {MAX_CONTENT_BYTES} bytes"));
            }
            let ext = std::path::Path::new(name)
                .extension()
                .and_then(|e| e.to_str());
            let saved = ctx
                .media
                .save(
                    Some(ctx.owner),
                    content.as_bytes(),
                    args["contentType"].as_str(),
                    ext,
                    Some(name),
                )
                .await
                .map_err(|e| format!("file not saved: {e}"))?;
            if let Some(run) = ctx.run {
                run.record_saved(crate::runtime::tree::SavedFile {
                    file_name: name.to_owned(),
                    media_id: saved.id.clone(),
                    size: saved.size,
                });
            }
            Ok(json!({
                "id": saved.id,
                "url": format!("/media/{}", saved.id),
                "contentType": saved.content_type,
                "size": saved.size,
            })
            .to_string())
        })
    }
}
