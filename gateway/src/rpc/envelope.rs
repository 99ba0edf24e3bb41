//! JSON-RPC 2.0 envelopes shared by /ws and /rpc: single calls, batches, notifications.

use futures_util::future::join_all;
use serde_json::Value;
use tracing::Instrument;

use super::generated::dispatch::dispatch;
use super::generated::methods::MethodId;
use super::{CallContext, RpcError};
use crate::handlers::Rpc;

/// What came back for one incoming message.
#[derive(Debug, PartialEq)]
pub enum Reply {
    /// Nothing to send (notifications only).
    None,
    /// One response object, or an array for a batch.
    Some(Value),
}

/// Handles one text message (a WebSocket frame or an HTTP body).
pub async fn handle_text(rpc: &Rpc, ctx: &CallContext, text: &str, max_batch: usize) -> Reply {
    let parsed: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(_) => return Reply::Some(RpcError::parse_error().response(Value::Null)),
    };
    match parsed {
        Value::Array(items) if items.is_empty() => {
            Reply::Some(RpcError::invalid_request("empty batch").response(Value::Null))
        }
        Value::Array(items) if items.len() > max_batch => Reply::Some(
            RpcError::invalid_request(&format!(
                "batch of {} exceeds maxBatchSize {max_batch}",
                items.len()
            ))
            .response(Value::Null),
        ),
        Value::Array(items) => {
            let replies = join_all(items.into_iter().map(|item| handle_one(rpc, ctx, item))).await;
            let out: Vec<Value> = replies.into_iter().flatten().collect();
            if out.is_empty() {
                Reply::None
            } else {
                Reply::Some(Value::Array(out))
            }
        }
        other => match handle_one(rpc, ctx, other).await {
            Some(v) => Reply::Some(v),
            None => Reply::None,
        },
    }
}

/// A request's `id`: present and valid, absent (notification), or invalid.
enum Id {
    Valid(Value),
    Absent,
    Invalid,
}

fn request_id(obj: &serde_json::Map<String, Value>) -> Id {
    match obj.get("id") {
        None => Id::Absent,
        Some(v @ Value::String(_)) => Id::Valid(v.clone()),
        Some(Value::Number(n)) if n.is_i64() || n.is_u64() => Id::Valid(Value::Number(n.clone())),
        Some(_) => Id::Invalid,
    }
}

/// One request object -> its response (None for a notification).
async fn handle_one(rpc: &Rpc, ctx: &CallContext, item: Value) -> Option<Value> {
    let Value::Object(obj) = item else {
        return Some(RpcError::invalid_request("not a request object").response(Value::Null));
    };
    let id = match request_id(&obj) {
        Id::Valid(v) => Some(v),
        Id::Absent => None,
        Id::Invalid => {
            return Some(
                RpcError::invalid_request("id must be an integer or a string")
                    .response(Value::Null),
            )
        }
    };
    let invalid = |detail: &str| {
        Some(RpcError::invalid_request(detail).response(id.clone().unwrap_or(Value::Null)))
    };
    if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return invalid("jsonrpc must be \"2.0\"");
    }
    let Some(method) = obj.get("method").and_then(Value::as_str) else {
        return invalid("method must be a string");
    };
    let params = match obj.get("params") {
        None => Ok(None),
        Some(Value::Object(p)) => Ok(Some(Value::Object(p.clone()))),
        // Lookup still comes first: an unknown method is -32601 whatever its params.
        Some(Value::Array(_)) if MethodId::from_name(method).is_none() => {
            Err(RpcError::method_not_found(method))
        }
        Some(Value::Array(_)) => Err(RpcError::invalid_params(
            "params must be an object (by-name); positional arrays are not supported",
        )),
        Some(_) => return invalid("params must be an object"),
    };
    let span = tracing::info_span!("rpc", method = %method, client = %ctx.client_id);
    let outcome = match params {
        Ok(params) => {
            dispatch(rpc, ctx, method, params)
                .instrument(span.clone())
                .await
        }
        Err(e) => Err(e),
    };
    if let Err(e) = &outcome {
        span.in_scope(|| tracing::debug!(code = e.code, "call failed"));
    }
    let id = id?;
    Some(match outcome {
        Ok(result) => serde_json::json!({"jsonrpc": "2.0", "result": result, "id": id}),
        Err(e) => e.response(id),
    })
}
