//! JSON-RPC 2.0 envelopes shared by /ws and /rpc: single calls, batches, notifications.

use std::time::Instant;

use futures_util::future::join_all;
use serde_json::Value;
use tracing::Instrument;

use crate::api::generated::dispatch::dispatch;
use crate::api::generated::handlers::Handlers;
use crate::api::generated::methods::MethodId;
use crate::api::{CallContext, RpcError};
use crate::metrics::{rpc_call, RpcMethod};

/// A message refused before any method is known: counted under `unknown`, then answered.
fn refused(e: RpcError, started: Instant) -> RpcError {
    rpc_call(RpcMethod::UNKNOWN, Err(e.code), started.elapsed());
    e
}

/// What came back for one incoming message.
#[derive(Debug, PartialEq)]
pub enum Reply {
    /// Nothing to send (notifications only).
    None,
    /// One response object, or an array for a batch.
    Some(Value),
}

/// Handles one text message (a WebSocket frame or an HTTP body) with any handler set (the
/// gateway's is `handlers::Rpc`).
pub async fn handle_text<H: Handlers>(
    rpc: &H,
    ctx: &CallContext,
    text: &str,
    max_batch: usize,
) -> Reply {
    let started = Instant::now();
    let parsed: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(_) => {
            return Reply::Some(refused(RpcError::parse_error(), started).response(Value::Null))
        }
    };
    match parsed {
        Value::Array(items) if items.is_empty() => Reply::Some(
            refused(RpcError::invalid_request("empty batch"), started).response(Value::Null),
        ),
        Value::Array(items) if items.len() > max_batch => Reply::Some(
            refused(
                RpcError::invalid_request(&format!(
                    "batch of {} exceeds maxBatchSize {max_batch}",
                    items.len()
                )),
                started,
            )
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

/// One request object -> its response (None for a notification). Every call is counted
/// here, whichever transport brought it (`agentgw_rpc_requests_total`).
async fn handle_one<H: Handlers>(rpc: &H, ctx: &CallContext, item: Value) -> Option<Value> {
    let started = Instant::now();
    let Value::Object(obj) = item else {
        return Some(
            refused(RpcError::invalid_request("not a request object"), started)
                .response(Value::Null),
        );
    };
    let id = match request_id(&obj) {
        Id::Valid(v) => Some(v),
        Id::Absent => None,
        Id::Invalid => {
            return Some(
                refused(
                    RpcError::invalid_request("id must be an integer or a string"),
                    started,
                )
                .response(Value::Null),
            )
        }
    };
    let invalid = |detail: &str| {
        Some(
            refused(RpcError::invalid_request(detail), started)
                .response(id.clone().unwrap_or(Value::Null)),
        )
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
    let counted = RpcMethod::of(method);
    let span = tracing::info_span!("rpc", method = %crate::logging::escaped(method), client = %crate::logging::escaped(&ctx.client_id));
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
    rpc_call(
        counted,
        outcome.as_ref().map(drop).map_err(|e| e.code),
        started.elapsed(),
    );
    let id = id?;
    Some(match outcome {
        Ok(result) => serde_json::json!({"jsonrpc": "2.0", "result": result, "id": id}),
        Err(e) => e.response(id),
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::api::error::GatewayError;
    use crate::api::generated::handlers::Fake;
    use crate::api::generated::methods::RecordKind;
    use crate::api::tenancy::{Lookup, Owners, Tenant};
    use crate::auth::TokenStore;
    use crate::config::TokenConfig;

    /// Every record belongs to alice.
    struct Alices;

    impl Owners for Alices {
        async fn lookup(
            &self,
            _kind: RecordKind,
            _id: &str,
            _tenant: &Tenant,
        ) -> Result<Lookup, GatewayError> {
            Ok(Lookup::Exists(Some("alice".to_owned())))
        }
    }

    fn ctx(id: &str, scope: &str) -> CallContext {
        let secret = format!("{id}-secret-0123456789abcdefghijklmnopqrstuvwxyz");
        let store = TokenStore::new(&[TokenConfig {
            id: id.to_owned(),
            secret: secret.clone(),
            scopes: vec![scope.to_owned()],
        }]);
        store
            .verify(&secret)
            .map(|p| p.context(None))
            .unwrap_or_else(|| unreachable!("the token was just configured"))
    }

    async fn call(fake: &Fake<Alices>, ctx: &CallContext, text: &str) -> Value {
        match handle_text(fake, ctx, text, 2).await {
            Reply::Some(v) => v,
            Reply::None => Value::Null,
        }
    }

    fn ran(fake: &Fake<Alices>) -> Vec<&'static str> {
        fake.ran.lock().map(|r| r.clone()).unwrap_or_default()
    }

    #[tokio::test]
    async fn lookup_scope_params_ownership_then_the_handler() {
        let fake = Fake::new(Alices);
        let (alice, mallory, admin) = (
            ctx("alice", "rpc"),
            ctx("mallory", "rpc"),
            ctx("root", "admin"),
        );
        let history =
            r#"{"jsonrpc":"2.0","id":1,"method":"session.history","params":{"session_key":"k"}}"#;
        // Another tenant's record: the not-found answer, and the handler never runs.
        let r = call(&fake, &mallory, history).await;
        assert_eq!(
            r["error"],
            json!({"code": -32001, "message": "Session not found: k"})
        );
        assert!(ran(&fake).is_empty());
        // Its owner and admin reach the handler.
        assert_eq!(call(&fake, &alice, history).await["error"]["code"], -32003);
        assert_eq!(call(&fake, &admin, history).await["error"]["code"], -32003);
        assert_eq!(ran(&fake), ["session.history", "session.history"]);
        // Scope before params, params before ownership; none of them runs a handler.
        let delete = r#"{"jsonrpc":"2.0","id":2,"method":"session.delete","params":{"key":"k"}}"#;
        assert_eq!(call(&fake, &mallory, delete).await["error"]["code"], -32603);
        let bad = r#"{"jsonrpc":"2.0","id":3,"method":"session.history","params":{}}"#;
        assert_eq!(call(&fake, &mallory, bad).await["error"]["code"], -32602);
        let unknown = r#"{"jsonrpc":"2.0","id":4,"method":"session.nope","params":[]}"#;
        assert_eq!(
            call(&fake, &mallory, unknown).await["error"]["code"],
            -32601
        );
        // A tenant rule compares without a lookup: naming another tenant is refused.
        let other = r#"{"jsonrpc":"2.0","id":5,"method":"agent.execute","params":{"message":"m","sessionKey":{"tenantId":"alice"}}}"#;
        assert_eq!(call(&fake, &mallory, other).await["error"]["code"], -32001);
        assert_eq!(ran(&fake).len(), 2);
        // Batches keep their order; a batch over the limit and notifications answer as the
        // envelope rules say.
        let batch = format!("[{history}, {bad}]");
        let r = call(&fake, &mallory, &batch).await;
        assert_eq!(
            (r[0]["id"].clone(), r[1]["id"].clone()),
            (json!(1), json!(3))
        );
        let r = call(
            &fake,
            &mallory,
            &format!("[{history}, {history}, {history}]"),
        )
        .await;
        assert_eq!(r["error"]["code"], -32600);
        let note = r#"{"jsonrpc":"2.0","method":"session.history","params":{"session_key":"k"}}"#;
        assert_eq!(call(&fake, &alice, note).await, Value::Null);
        assert_eq!(ran(&fake).len(), 3, "a notification still runs");
    }
}
