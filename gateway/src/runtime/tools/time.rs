//! `current_time`: the current date and time.

use serde_json::{json, Value};

use super::{Tool, ToolContext, ToolResult};
use crate::providers::BoxFuture;

pub struct CurrentTime;

impl Tool for CurrentTime {
    fn name(&self) -> &'static str {
        "current_time"
    }

    fn description(&self) -> &'static str {
        "Returns the current date and time (UTC, RFC 3339) and the Unix time in milliseconds."
    }

    fn parameters(&self) -> Value {
        json!({"type": "object", "properties": {}, "additionalProperties": false})
    }

    fn call<'a>(
        &'a self,
        _ctx: &'a ToolContext<'a>,
        _args: &'a Value,
    ) -> BoxFuture<'a, ToolResult> {
        Box::pin(async {
            let now = chrono::Utc::now();
            Ok(json!({
                "utc": now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                "epochMs": now.timestamp_millis(),
            })
            .to_string())
        })
    }
}
