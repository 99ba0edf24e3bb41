//! GET /ws: JSON-RPC over WebSocket - Origin check, auth (4001 after upgrade), size and rate
//! limits before parsing, concurrent calls, heartbeats, server push, and 1001 on shutdown.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use poem::web::websocket::{CloseCode, Message, WebSocket, WebSocketStream};
use poem::web::Data;
use poem::{IntoResponse, Request, Response};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::envelope::{handle_text, Reply};
use super::RpcError;
use crate::auth::Principal;
use crate::handlers::Rpc;
use crate::http::json_error;
use crate::hub::Outbound;
use crate::state::AppState;

/// Close code of a normal closure.
pub const CLOSE_NORMAL: u16 = 1000;
/// Close code for a failed authentication.
pub const CLOSE_UNAUTHORIZED: u16 = 4001;
/// Close code and reason when the server stops or restarts.
pub const CLOSE_GOING_AWAY: u16 = 1001;
pub const SHUTDOWN_REASON: &str = "Server shutting down";
/// How long a close frame may take to reach a client that does not read.
const CLOSE_SEND_TIMEOUT: Duration = Duration::from_secs(1);
/// Outbound frames queued per connection before senders wait.
const OUTBOUND_QUEUE: usize = 256;

#[poem::handler]
pub async fn upgrade(req: &Request, ws: WebSocket, Data(state): Data<&Arc<AppState>>) -> Response {
    if !origin_allowed(req, &state.config.gateway.allowed_origins) {
        return json_error(http::StatusCode::FORBIDDEN, "Origin not allowed");
    }
    let principal = state.tokens.authenticate(req, true).cloned();
    let state = state.clone();
    ws.on_upgrade(move |socket| async move {
        match principal {
            Some(p) => connection(state, p, socket).await,
            None => {
                let mut socket = socket;
                let frame = Message::Close(Some((
                    CloseCode::from(CLOSE_UNAUTHORIZED),
                    "Unauthorized".to_owned(),
                )));
                let _ = tokio::time::timeout(CLOSE_SEND_TIMEOUT, socket.send(frame)).await;
            }
        }
    })
    .into_response()
}

/// A browser's Origin must be the gateway's own origin or listed; no Origin is a non-browser client.
fn origin_allowed(req: &Request, allowed: &[String]) -> bool {
    let Some(origin) = req.headers().get(http::header::ORIGIN) else {
        return true;
    };
    let Ok(origin) = origin.to_str() else {
        return false;
    };
    let origin = origin.trim_end_matches('/');
    if allowed
        .iter()
        .any(|a| a.trim_end_matches('/').eq_ignore_ascii_case(origin))
    {
        return true;
    }
    let host = req
        .headers()
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default();
    match url::Url::parse(origin) {
        Ok(u) if matches!(u.scheme(), "http" | "https") => {
            let authority = match (u.host_str(), u.port()) {
                (Some(h), Some(p)) => format!("{h}:{p}"),
                (Some(h), None) => h.to_owned(),
                _ => return false,
            };
            !host.is_empty() && authority.eq_ignore_ascii_case(host)
        }
        _ => false,
    }
}

/// Sliding-window message counter of one connection.
struct Window {
    max: usize,
    len: Duration,
    stamps: VecDeque<Instant>,
}

impl Window {
    /// Counts `n` messages (a batch's items) unless they do not all fit in the window
    /// (refused messages are not counted).
    fn admit(&mut self, now: Instant, n: usize) -> bool {
        while self
            .stamps
            .front()
            .is_some_and(|t| now.duration_since(*t) >= self.len)
        {
            self.stamps.pop_front();
        }
        if self.stamps.len() + n > self.max {
            return false;
        }
        self.stamps.extend(std::iter::repeat_n(now, n));
        true
    }
}

async fn connection(state: Arc<AppState>, principal: Principal, socket: WebSocketStream) {
    let g = &state.config.gateway;
    let (mut sink, mut stream) = socket.split();
    let (tx, mut rx) = mpsc::channel::<Outbound>(OUTBOUND_QUEUE);
    let conn_id = state.hub().register(&principal.client_id, tx.clone());
    let ctx = principal.context(Some(conn_id));
    tracing::debug!(conn = conn_id, client = %principal.client_id, "websocket open");

    let writer = tokio::spawn(async move {
        while let Some(out) = rx.recv().await {
            match out {
                Outbound::Text(t) => {
                    if sink.send(Message::Text(t)).await.is_err() {
                        break;
                    }
                }
                Outbound::Close(code, reason) => {
                    // After a peer's close, tungstenite has queued its own reply: the send is
                    // refused and the flush delivers that reply instead.
                    let frame = Message::Close(Some((CloseCode::from(code), reason)));
                    let _ = tokio::time::timeout(CLOSE_SEND_TIMEOUT, async {
                        let _ = sink.send(frame).await;
                        let _ = sink.flush().await;
                        let _ = sink.close().await;
                    })
                    .await;
                    break;
                }
            }
        }
    });

    let heartbeat = (g.ws_heartbeat_ms > 0).then(|| {
        let tx = tx.clone();
        let every = Duration::from_millis(g.ws_heartbeat_ms);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            loop {
                tick.tick().await;
                let ts = chrono::Utc::now().timestamp_millis();
                let text = json!({"jsonrpc": "2.0", "method": "heartbeat", "params": {"ts": ts}})
                    .to_string();
                if tx.send(Outbound::Text(text)).await.is_err() {
                    break;
                }
            }
        })
    });

    let mut window = Window {
        max: g.ws_message_rate_limit.max_messages,
        len: Duration::from_millis(g.ws_message_rate_limit.window_ms),
        stamps: VecDeque::new(),
    };
    let max_chars = g.ws_max_message_bytes;
    let max_batch = g.max_batch_size;
    let stop = state.stop.clone();
    loop {
        let msg = tokio::select! {
            _ = stop.cancelled() => {
                let _ = tx.send(Outbound::Close(CLOSE_GOING_AWAY, SHUTDOWN_REASON.to_owned())).await;
                break;
            }
            m = stream.next() => m,
        };
        let reply_now = |v: Value| {
            let tx = tx.clone();
            async move {
                let _ = tx.send(Outbound::Text(v.to_string())).await;
            }
        };
        match msg {
            Some(Ok(Message::Text(text))) => {
                // Size first (counted in characters, before parsing); refused frames do not count.
                if text.len() > max_chars && text.chars().count() > max_chars {
                    reply_now(
                        RpcError::invalid_request(&format!(
                            "message exceeds wsMaxMessageBytes ({max_chars})"
                        ))
                        .response(Value::Null),
                    )
                    .await;
                    continue;
                }
                let items = crate::rpc::http::batch_items(&text, max_batch) as usize;
                if !window.admit(Instant::now(), items) {
                    reply_now(RpcError::rate_limited().response(Value::Null)).await;
                    continue;
                }
                let rpc = Rpc::new(state.clone());
                let ctx = ctx.clone();
                let tx = tx.clone();
                tokio::spawn(async move {
                    if let Reply::Some(v) = handle_text(&rpc, &ctx, &text, max_batch).await {
                        let _ = tx.send(Outbound::Text(v.to_string())).await;
                    }
                });
            }
            Some(Ok(Message::Binary(_))) => {
                let v = if window.admit(Instant::now(), 1) {
                    RpcError::parse_error()
                } else {
                    RpcError::rate_limited()
                };
                reply_now(v.response(Value::Null)).await;
            }
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
            Some(Ok(Message::Close(_))) => {
                // Complete the closing handshake: a normal close is answered with 1000.
                let _ = tx.send(Outbound::Close(CLOSE_NORMAL, String::new())).await;
                break;
            }
            Some(Err(_)) | None => break,
        }
    }
    if let Some(h) = heartbeat {
        h.abort();
    }
    state.hub().unregister(conn_id);
    drop(tx);
    // The writer drains what is queued (the close frame last), bounded by the send timeout.
    let mut writer = writer;
    if tokio::time::timeout(CLOSE_SEND_TIMEOUT * 2, &mut writer)
        .await
        .is_err()
    {
        writer.abort();
        tracing::debug!(conn = conn_id, "websocket writer did not finish in time");
    }
    tracing::debug!(conn = conn_id, "websocket closed");
}
