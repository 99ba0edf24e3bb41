//! `POST <base>/webhook` (strict, always signed) and `POST <base>/<path>` (mapped): the spec's
//! "Webhook routing" and "Webhook responses". Agent runs are queued and acknowledged at
//! once; their answers land in the mapping's session.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use poem::web::Data;
use poem::{handler, Body, IntoResponse, Request, Response};
use serde_json::{json, Value};

use crate::api::generated::methods::Scope;
use crate::api::principal::Principal;
use crate::app::state::AppState;
use crate::config::webhooks::{
    self as settings, Action, MappingConfig, WakeMode, DEFAULT_TIMEOUT_SECS,
};
use crate::obs::recorder::webhook_event;
use crate::runtime::runs::RunSpec;
use crate::runtime::sessions::SessionIdent;
use crate::runtime::untrusted::untrusted;
use crate::store::runs::Delivery;
use crate::store::sessions::InternalChannel;
use crate::transport::json_error;
use crate::transport::limits::{read_body, BodyError};
use crate::webhooks::{message_of, session_part, RequestContext, Webhooks};

/// The strict endpoint's path below the base.
pub const STRICT_PATH: &str = "webhook";
/// Channel name of webhook sessions (the mapping id is their namespace).
pub const WEBHOOK_CHANNEL: &str = InternalChannel::Webhook.label();

fn ok(body: Value) -> Response {
    (StatusCode::OK, poem::web::Json(body)).into_response()
}

fn internal() -> Response {
    json_error(StatusCode::INTERNAL_SERVER_ERROR, "Internal error")
}

/// Every webhook request.
#[handler]
pub async fn hook(req: &Request, body: Body, state: Data<&Arc<AppState>>) -> Response {
    let state = *state;
    let Some(hooks) = state.webhooks.clone() else {
        return json_error(StatusCode::NOT_FOUND, "Not found");
    };
    let path = settings::normalize(req.uri().path());
    let strict = path == STRICT_PATH;
    let g = &state.config.gateway;
    let limit = if strict {
        g.http_body_limit_bytes
    } else {
        hooks.max_body_bytes
    };
    let bytes = match read_body(
        req,
        body,
        limit,
        Duration::from_millis(g.body_read_timeout_ms),
    )
    .await
    {
        Ok(b) => b,
        Err(BodyError::TooLarge) if strict => {
            return json_error(
                StatusCode::PAYLOAD_TOO_LARGE,
                &format!("Request body exceeds {limit} bytes"),
            )
        }
        Err(BodyError::TooLarge) => {
            return json_error(StatusCode::BAD_REQUEST, "Request body exceeds maximum size")
        }
        Err(BodyError::Timeout) => {
            return json_error(
                StatusCode::REQUEST_TIMEOUT,
                "Request body not received in time",
            )
        }
        Err(BodyError::Io) => {
            return json_error(StatusCode::BAD_REQUEST, "Request body could not be read")
        }
    };
    let engine = &state.engine;
    // Signed before anything else is looked at, so unsigned requests cannot probe paths.
    let verifier = if strict {
        match hooks.strict.as_ref() {
            Some(v) => Some(v),
            None => {
                return json_error(
                    StatusCode::UNAUTHORIZED,
                    "Webhook signing secret not configured",
                )
            }
        }
    } else {
        hooks.mapped.as_ref()
    };
    let signed = match verifier {
        None => false,
        Some(v) => match v.verify(req.headers(), &bytes, chrono::Utc::now().timestamp()) {
            Ok(_) => true,
            Err(rejection) => {
                // Caused by an unauthenticated request: operators see it, tenants never do.
                engine.emit_operator(
                    "audit:event",
                    json!({"kind": "webhook.rejected", "path": path, "reason": rejection.message()}),
                );
                webhook_event(
                    &engine.store,
                    "webhook.rejected",
                    None,
                    None,
                    json!({"strict": strict, "reason": rejection.message()}),
                );
                return json_error(StatusCode::UNAUTHORIZED, rejection.message());
            }
        },
    };
    let Ok(payload) = serde_json::from_slice::<Value>(&bytes) else {
        return json_error(StatusCode::BAD_REQUEST, "Invalid JSON body");
    };
    if strict {
        let issues = strict_issues(&payload);
        if !issues.is_empty() {
            return (
                StatusCode::UNPROCESSABLE_ENTITY,
                poem::web::Json(json!({"error": "Validation failed", "issues": issues})),
            )
                .into_response();
        }
    }
    let ctx = RequestContext {
        headers: header_map(req),
        query: query_map(req),
        path: path.clone(),
        now: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        payload,
    };
    let matched = hooks.route(&path, &ctx.payload).cloned();
    let Some(mapping) = matched else {
        if strict {
            // A strict event no mapping takes is recorded and acknowledged (for operators:
            // webhook events name paths, mappings and session keys of the whole gateway).
            engine.emit_operator(
                "webhook:received",
                json!({"path": path, "event": ctx.payload.get("event"), "source": ctx.payload.get("source"), "mapping": null}),
            );
            return ok(json!({"received": true}));
        }
        webhook_event(&engine.store, "webhook.unmatched", None, None, json!({}));
        return json_error(StatusCode::NOT_FOUND, "No matching webhook mapping");
    };
    let ack = if strict {
        json!({"received": true})
    } else {
        json!({"received": true, "mapping": mapping.id})
    };
    // A signed delivery is identified by what the signature covers (the body), per endpoint
    // path; not by the timestamp header, which is not signed and so could be changed to get
    // a replay past the guard. Remembered in the database: a restart does not forget it.
    let delivery = signed.then(|| delivery_id(&path, &bytes));
    if let Some(d) = &delivery {
        let now = crate::clock::now_ms();
        let expires = now.saturating_add(hooks.replay_window.as_millis() as i64);
        match engine
            .store
            .webhook_delivery_seen(d, now, expires, crate::webhooks::REPLAY_CAPACITY)
            .await
        {
            Ok(Delivery::First) => {}
            Ok(Delivery::Repeat) => {
                webhook_event(
                    &engine.store,
                    "webhook.replayed",
                    Some(&mapping.id),
                    None,
                    json!({"mapping": mapping.id}),
                );
                engine.emit_operator(
                    "webhook:received",
                    json!({"path": path, "mapping": mapping.id, "replay": true}),
                );
                return ok(ack);
            }
            Err(e) => {
                tracing::error!(error = %e, "webhook delivery not recorded");
                return internal();
            }
        }
    }
    match act(state, &hooks, &mapping, &ctx).await {
        None => ok(ack),
        Some(refusal) => {
            // Not acted on: a redelivery must not be taken for a replay.
            if let Some(d) = &delivery {
                if let Err(e) = engine.store.webhook_delivery_forget(d).await {
                    tracing::error!(error = %e, "webhook delivery not forgotten");
                }
            }
            refusal
        }
    }
}

/// Hex SHA-256 over the endpoint path, a 0 byte and the body's SHA-256.
pub fn delivery_id(path: &str, body: &[u8]) -> String {
    use sha2::Digest;
    let body_digest = sha2::Sha256::digest(body);
    let mut h = sha2::Sha256::new();
    h.update(path.as_bytes());
    h.update([0]);
    h.update(body_digest);
    hex::encode(h.finalize())
}

/// Runs the mapping's action (queued); Some is the response to send instead of 200. A run is
/// written to the database as queued before this returns, so an acknowledged run survives a
/// killed process (it is resumed at the next start).
async fn act(
    state: &Arc<AppState>,
    hooks: &Webhooks,
    m: &MappingConfig,
    ctx: &RequestContext,
) -> Option<Response> {
    let engine = &state.engine;
    let agent_id = m
        .agent_id
        .clone()
        .or_else(|| engine.agents.default_id())
        .unwrap_or_default();
    let agent = match engine.agents.require(&agent_id) {
        Ok(a) => a,
        Err(e) => {
            tracing::error!(mapping = %m.id, agent = %agent_id, error = %e, "webhook mapping names no usable agent");
            return Some(internal());
        }
    };
    let source = format!("webhook mapping '{}'", m.id);
    let text = untrusted(&source, &message_of(m, ctx));
    // What `webhook:received` says about a mapping that acted (wakeMode only for wakes).
    let received = |session_key: Option<&str>| {
        let wake_mode = (m.action == Action::Wake).then(|| m.wake_mode.as_str());
        webhook_event(
            &engine.store,
            "webhook.received",
            Some(&m.id),
            session_key,
            json!({"mapping": m.id, "action": m.action.as_str(), "agentId": agent.id}),
        );
        engine.emit_operator(
            "webhook:received",
            json!({"path": ctx.path, "mapping": m.id, "action": m.action.as_str(),
                   "wakeMode": wake_mode, "agentId": agent.id, "sessionKey": session_key}),
        );
    };
    // Wakes go to the scheduler's coalescer: the event waits in the store for the agent's next
    // heartbeat tick, which `now` queues at once (folded into one already queued).
    if m.action == Action::Wake {
        let source = format!("webhook:{}", m.id);
        let done = if m.wake_mode == WakeMode::NextHeartbeat {
            engine
                .scheduler
                .heartbeat_event(&agent.id, &source, &text)
                .await
        } else {
            engine
                .scheduler
                .heartbeat_wake(&agent.id, &source, Some(&text), false)
                .await
                .map(drop)
        };
        if let Err(e) = done {
            tracing::error!(mapping = %m.id, error = %e, "webhook wake not recorded");
            return Some(internal());
        }
        let session = crate::runtime::scheduler::beat::session_for(
            &agent.id,
            &engine.scheduler.heartbeat_of(&agent),
        )
        .ok();
        received(session.as_ref().map(|s| s.key.as_str()));
        return None;
    }
    // A place in the queue first: a delivery refused for a full queue leaves nothing behind.
    let Some(place) = hooks.queue.reserve() else {
        crate::metrics::rate_limited(crate::metrics::Limiter::WebhookQueue);
        webhook_event(
            &engine.store,
            "webhook.refused",
            Some(&m.id),
            None,
            json!({"mapping": m.id, "reason": "queue_full"}),
        );
        let mut resp = json_error(StatusCode::SERVICE_UNAVAILABLE, "Webhook run queue is full");
        resp.headers_mut().insert(
            http::header::RETRY_AFTER,
            http::HeaderValue::from_static("5"),
        );
        return Some(resp);
    };
    // An agent run (wakes returned above).
    let rendered = m
        .session_key
        .as_deref()
        .map(|t| session_part(&ctx.render(t)))
        .unwrap_or_default();
    let part = if rendered.is_empty() {
        uuid::Uuid::new_v4().simple().to_string()
    } else {
        rendered
    };
    let (task, session) = (
        text,
        SessionIdent::internal(InternalChannel::Webhook, &agent.id, &m.id, &part),
    );
    let delivery = (m.deliver.is_some() || m.channel.is_some() || m.to.is_some()).then(|| {
        json!({"deliver": m.deliver.unwrap_or(false), "channel": m.channel, "to": m.to}).to_string()
    });
    received(Some(&session.key));
    let spec = RunSpec {
        agent: agent.clone(),
        session,
        task,
        caller: Principal::internal(&format!("webhook:{}", m.id)).context(None),
        scopes: crate::api::scopes::Scopes::only(Scope::Rpc),
        parent: None,
        spawned: false,
        max_steps: None,
        model: m.model.clone(),
        only_tools: None,
        timeout: Some(Duration::from_secs(
            m.timeout_seconds.unwrap_or(DEFAULT_TIMEOUT_SECS),
        )),
        delivery,
    };
    if let Err(e) = crate::runtime::queue::enqueue(&engine.runs, place, spec).await {
        tracing::error!(mapping = %m.id, error = %e, "webhook run not queued");
        return Some(internal());
    }
    None
}

/// Request headers by lowercase name (first value; secrets are left to the template rules).
fn header_map(req: &Request) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (name, value) in req.headers() {
        if let Ok(v) = value.to_str() {
            out.entry(name.as_str().to_owned())
                .or_insert_with(|| v.to_owned());
        }
    }
    out
}

/// Query parameters (first value); credentials some senders put in URLs render empty.
fn query_map(req: &Request) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    if let Some(q) = req.uri().query() {
        for (k, v) in url::form_urlencoded::parse(q.as_bytes()) {
            let value = if crate::webhooks::template::is_sensitive_header(&k.to_lowercase()) {
                String::new()
            } else {
                v.into_owned()
            };
            out.entry(k.into_owned()).or_insert(value);
        }
    }
    out
}

/// What is wrong with a strict payload (`event`, `source`, `data`, optional `timestamp`;
/// nothing else), as `{path, message}` entries.
pub fn strict_issues(v: &Value) -> Vec<Value> {
    let issue = |path: &str, message: &str| json!({"path": path, "message": message});
    let Some(obj) = v.as_object() else {
        return vec![issue("", "Expected a JSON object")];
    };
    let mut out = Vec::new();
    for key in ["event", "source"] {
        match obj.get(key) {
            None => out.push(issue(key, "Required")),
            Some(Value::String(s)) if !s.trim().is_empty() => {}
            Some(Value::String(_)) => out.push(issue(key, "Must not be empty")),
            Some(_) => out.push(issue(key, "Expected a string")),
        }
    }
    match obj.get("data") {
        None => out.push(issue("data", "Required")),
        Some(Value::Object(_)) => {}
        Some(_) => out.push(issue("data", "Expected an object")),
    }
    match obj.get("timestamp") {
        None => {}
        Some(Value::String(s)) if chrono::DateTime::parse_from_rfc3339(s).is_ok() => {}
        Some(_) => out.push(issue(
            "timestamp",
            "Expected an ISO 8601 date-time string (e.g. 2026-01-31T12:00:00Z)",
        )),
    }
    for key in obj.keys() {
        if !matches!(key.as_str(), "event" | "source" | "data" | "timestamp") {
            out.push(issue(key, "Unknown field"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strict_payload_rules() {
        assert!(strict_issues(&json!({"event": "e", "source": "s", "data": {}})).is_empty());
        assert!(strict_issues(
            &json!({"event": "e", "source": "s", "data": {"a": 1}, "timestamp": "2026-01-31T12:00:00Z"})
        )
        .is_empty());
        let bad = strict_issues(&json!({"event": 1, "data": [], "timestamp": "yesterday", "x": 1}));
        let paths: Vec<&str> = bad.iter().filter_map(|i| i["path"].as_str()).collect();
        assert_eq!(paths, ["event", "source", "data", "timestamp", "x"]);
        assert_eq!(strict_issues(&json!([1])).len(), 1);
        assert_eq!(
            strict_issues(&json!({"event": " ", "source": "s", "data": {}}))[0]["message"],
            "Must not be empty"
        );
    }
}
