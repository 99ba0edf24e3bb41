//! GET /ws: JSON-RPC over WebSocket - the upgrade (Origin check, auth: 4001 after upgrade),
//! socket limits (characters before parsing, bytes before buffering: 1009), the per-connection
//! message rate, concurrent calls, replies and pushes through a bounded queue that never
//! blocks the reader, and 1001 on shutdown; one task per connection.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures_util::{FutureExt, SinkExt, StreamExt};
use poem::web::Data;
use poem::{Request, Response};
use serde_json::Value;
use tokio::io::AsyncReadExt;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::error::{CapacityError, Error as WsError};
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;
use tokio_util::sync::CancellationToken;

use super::envelope::{handle_text, Reply};
use crate::api::principal::Principal;
use crate::api::RpcError;
use crate::app::state::AppState;
use crate::handlers::Rpc;
use crate::hub::{ConnTicket, Frame, Outbox, OUTBOUND_QUEUE};
use crate::transport::json_error;
use crate::transport::watch::Watched;

/// Close code of a normal closure.
pub const CLOSE_NORMAL: u16 = 1000;
/// Close code for a failed authentication.
pub const CLOSE_UNAUTHORIZED: u16 = 4001;
/// Close reason when the connection's token was revoked or rotated (code 4001).
pub const REVOKED_REASON: &str = "Token revoked";
/// Close reason when the connection's token reached its `expiresAt` (code 4001).
pub const EXPIRED_REASON: &str = "Token expired";
/// Close code and reason when the server stops or restarts.
pub const CLOSE_GOING_AWAY: u16 = 1001;
pub const SHUTDOWN_REASON: &str = "Server shutting down";
/// Close code and reason for a message past the byte cap (see [`socket_config`]).
pub const CLOSE_TOO_BIG: u16 = 1009;
pub const TOO_BIG_REASON: &str = "Message too big";
/// How long a closing handshake may take with a client that does not read or answer.
const CLOSE_SEND_TIMEOUT: Duration = Duration::from_secs(1);
/// tungstenite reads at most this much per call, into a buffer allocated up front: sized for
/// an idle client (its default, 128 KiB, was most of an idle connection's memory). A larger
/// frame gets a buffer of its own size while it is read.
const READ_BUFFER: usize = 1024;
/// Frames written together are gathered up to this much before a write to the socket.
const WRITE_BUFFER: usize = 4096;

/// The socket limits for `gateway.wsMaxMessageBytes` = N characters. A character is at most
/// four bytes in UTF-8, so a message of N characters can be up to 4N bytes: frames and
/// messages up to 4N bytes are read and then counted in characters (-32600 past N); past 4N
/// bytes the socket is closed with 1009 as soon as the frame header says so, without reading
/// the message.
pub fn socket_config(max_chars: usize) -> WebSocketConfig {
    let max_bytes = max_chars.saturating_mul(4);
    WebSocketConfig::default()
        .read_buffer_size(READ_BUFFER)
        .write_buffer_size(WRITE_BUFFER)
        .max_write_buffer_size(usize::MAX)
        .max_message_size(Some(max_bytes))
        .max_frame_size(Some(max_bytes))
}

/// A WebSocket of the shared stack.
pub(crate) type Socket = WebSocketStream<poem::Upgraded>;

#[poem::handler]
pub async fn upgrade(req: &Request, Data(state): Data<&Arc<AppState>>) -> Response {
    accept(req, state, |state, principal, ws, kill| async move {
        match principal {
            Some(p) => connection(state, p, ws, kill).await,
            None => close(ws, CLOSE_UNAUTHORIZED, "Unauthorized").await,
        }
    })
}

/// The WebSocket stack every socket route shares: the Origin check, the RFC 6455 handshake,
/// the socket limits of [`socket_config`], the bearer token (its principal, None when it is
/// missing or wrong: the route closes with 4001 after the upgrade), and the connection's slot
/// and generation (`kill` fires when the generation drops its connections).
pub(crate) fn accept<F, Fut>(req: &Request, state: &Arc<AppState>, on_socket: F) -> Response
where
    F: FnOnce(Arc<AppState>, Option<Principal>, Socket, CancellationToken) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    if !origin_allowed(req, &state.config.gateway.allowed_origins) {
        return json_error(http::StatusCode::FORBIDDEN, "Origin not allowed");
    }
    let key = match handshake_key(req) {
        Ok(key) => key,
        Err(refusal) => return refusal.response(),
    };
    let Ok(on_upgrade) = req.take_upgrade() else {
        return json_error(
            http::StatusCode::BAD_REQUEST,
            "Expected a WebSocket upgrade",
        );
    };
    let principal = state.tokens.authenticate(req, true);
    let ticket = req.extensions().get::<ConnTicket>().cloned();
    let kill = ticket.as_ref().map(|t| t.kill.clone()).unwrap_or_default();
    let state = state.clone();
    let socket = async move {
        let Ok(io) = on_upgrade.await else {
            return;
        };
        let config = socket_config(state.config.gateway.ws_max_message_bytes);
        let ws = WebSocketStream::from_raw_socket(io, Role::Server, Some(config)).await;
        on_socket(state, principal, ws, kill).await;
    };
    match ticket {
        // The socket keeps the connection's slot and belongs to the generation.
        Some(t) => {
            let slot = t.slot;
            t.tracker.spawn(async move {
                socket.await;
                drop(slot);
            });
        }
        None => {
            #[allow(
                clippy::disallowed_methods,
                reason = "a connection or call outside the server's tracker ends when its socket closes"
            )]
            tokio::spawn(socket);
        }
    }
    Response::builder()
        .status(http::StatusCode::SWITCHING_PROTOCOLS)
        .header(http::header::CONNECTION, "upgrade")
        .header(http::header::UPGRADE, "websocket")
        .header(http::header::SEC_WEBSOCKET_ACCEPT, key)
        .finish()
}

/// Why an opening handshake is refused.
enum Refusal {
    NotAnUpgrade,
    Version,
    NoKey,
}

impl Refusal {
    /// 400, or 426 naming the version we speak.
    fn response(self) -> Response {
        match self {
            Self::NotAnUpgrade => json_error(
                http::StatusCode::BAD_REQUEST,
                "Expected a WebSocket upgrade",
            ),
            Self::NoKey => json_error(http::StatusCode::BAD_REQUEST, "Missing Sec-WebSocket-Key"),
            Self::Version => {
                let mut resp = json_error(
                    http::StatusCode::UPGRADE_REQUIRED,
                    "Unsupported WebSocket version",
                );
                resp.headers_mut().insert(
                    http::header::SEC_WEBSOCKET_VERSION,
                    http::HeaderValue::from_static("13"),
                );
                resp
            }
        }
    }
}

/// Checks the RFC 6455 opening handshake; the answer's `Sec-WebSocket-Accept` value.
fn handshake_key(req: &Request) -> Result<String, Refusal> {
    let h = req.headers();
    let has_token = |name: http::HeaderName, token: &str| {
        h.get_all(name).iter().any(|v| {
            v.to_str()
                .is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
        })
    };
    if req.method() != http::Method::GET
        || !has_token(http::header::UPGRADE, "websocket")
        || !has_token(http::header::CONNECTION, "upgrade")
    {
        return Err(Refusal::NotAnUpgrade);
    }
    if h.get(http::header::SEC_WEBSOCKET_VERSION)
        .is_none_or(|v| v.as_bytes() != b"13")
    {
        return Err(Refusal::Version);
    }
    match h.get(http::header::SEC_WEBSOCKET_KEY) {
        Some(key) if !key.is_empty() => Ok(derive_accept_key(key.as_bytes())),
        _ => Err(Refusal::NoKey),
    }
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

/// What woke the connection.
enum Step {
    Inbound(Option<Result<Message, WsError>>),
    WriteFailed,
}

/// Why the connection's task woke: a signal (in order of precedence) or its socket and queue.
enum Wake {
    Killed,
    Kicked,
    Revoked,
    Stopped,
    Step(Step),
}

/// How a connection ends.
enum End {
    /// Gone, failed, not reading, or past the grace period: nothing more is sent.
    Drop,
    /// The peer sent a close frame; tungstenite has queued the reply.
    PeerClosed,
    /// We close with this code and reason (shutdown, restart).
    Close(u16, &'static str),
    /// A message past the byte cap: 1009, and its bytes are discarded unread.
    TooBig,
}

/// One turn of the connection: moves queued frames into the socket while it takes them and
/// flushes, then reads. A socket that cannot take more leaves the frames queued and the
/// reading goes on (the queue, not the reader, notices a client that stopped reading).
fn pump(
    cx: &mut Context<'_>,
    ws: &mut Socket,
    rx: &mut mpsc::Receiver<Frame>,
    dirty: &mut bool,
) -> Poll<Step> {
    loop {
        match ws.poll_ready_unpin(cx) {
            Poll::Ready(Ok(())) => {}
            Poll::Ready(Err(_)) => return Poll::Ready(Step::WriteFailed),
            Poll::Pending => break,
        }
        match rx.poll_recv(cx) {
            Poll::Ready(Some(frame)) => {
                if ws.start_send_unpin(Message::Text(frame)).is_err() {
                    return Poll::Ready(Step::WriteFailed);
                }
                *dirty = true;
            }
            Poll::Ready(None) | Poll::Pending => break,
        }
    }
    if *dirty {
        match ws.poll_flush_unpin(cx) {
            Poll::Ready(Ok(())) => *dirty = false,
            Poll::Ready(Err(_)) => return Poll::Ready(Step::WriteFailed),
            Poll::Pending => {}
        }
    }
    ws.poll_next_unpin(cx).map(Step::Inbound)
}

async fn connection(
    state: Arc<AppState>,
    principal: Principal,
    mut ws: Socket,
    kill: CancellationToken,
) {
    let g = &state.config.gateway;
    let (outbox, mut rx) = Outbox::new(OUTBOUND_QUEUE);
    let conn_id = state.hub().register(&principal, outbox.clone());
    // `agentgw_websocket_connections` until this task ends, however it ends.
    let _open = crate::metrics::WsConnection::open();
    if !state.tokens.is_current(&principal) {
        outbox.revoked().cancel();
    }
    let ctx = principal.context(Some(conn_id));
    tracing::debug!(conn = conn_id, client = %principal.client_id, "websocket open");
    let mut window = Window {
        max: g.ws_message_rate_limit.max_messages,
        len: Duration::from_millis(g.ws_message_rate_limit.window_ms),
        stamps: VecDeque::new(),
    };
    let max_chars = g.ws_max_message_bytes;
    let max_batch = g.max_batch_size;
    // Read as flags at every wake-up, in this order (see `transport::watch`).
    let mut killed = Watched::new(&kill);
    let mut kicked = Watched::new(outbox.kicked());
    let mut revoked = Watched::new(outbox.revoked());
    let mut stopped = Watched::new(&state.stop);
    let mut dirty = false;
    let end = loop {
        let step = poll_fn(|cx| {
            if killed.fired(cx) {
                Poll::Ready(Wake::Killed)
            } else if kicked.fired(cx) {
                Poll::Ready(Wake::Kicked)
            } else if revoked.fired(cx) {
                Poll::Ready(Wake::Revoked)
            } else if stopped.fired(cx) {
                Poll::Ready(Wake::Stopped)
            } else {
                pump(cx, &mut ws, &mut rx, &mut dirty).map(Wake::Step)
            }
        })
        .await;
        let step = match step {
            Wake::Step(step) => step,
            Wake::Killed => break End::Drop,
            Wake::Kicked => {
                tracing::info!(conn = conn_id, client = %principal.client_id, "websocket client not reading its replies: dropped");
                break End::Drop;
            }
            Wake::Stopped => break End::Close(CLOSE_GOING_AWAY, SHUTDOWN_REASON),
            Wake::Revoked => {
                let reason = if principal.expired() {
                    EXPIRED_REASON
                } else {
                    REVOKED_REASON
                };
                tracing::info!(conn = conn_id, client = %principal.client_id, reason, "token no longer valid: websocket closed");
                break End::Close(CLOSE_UNAUTHORIZED, reason);
            }
        };
        let msg = match step {
            Step::Inbound(Some(Ok(msg))) => msg,
            Step::Inbound(Some(Err(WsError::Capacity(CapacityError::MessageTooLong {
                ..
            })))) => break End::TooBig,
            Step::Inbound(_) | Step::WriteFailed => break End::Drop,
        };
        match msg {
            Message::Text(text) => {
                // Size first (counted in characters, before parsing); refused frames do not count.
                if text.len() > max_chars && text.chars().count() > max_chars {
                    let refusal = RpcError::invalid_request(&format!(
                        "message exceeds wsMaxMessageBytes ({max_chars})"
                    ));
                    crate::metrics::rpc_refused(refusal.code);
                    outbox.push(refusal.response(Value::Null).to_string());
                    continue;
                }
                let items = crate::rpc::http::batch_items(&text, max_batch) as usize;
                if !window.admit(Instant::now(), items) {
                    crate::metrics::rate_limited(crate::metrics::Limiter::WsMessages);
                    let refusal = RpcError::rate_limited();
                    crate::metrics::rpc_refused(refusal.code);
                    outbox.push(refusal.response(Value::Null).to_string());
                    continue;
                }
                let rpc = Rpc::new(state.clone());
                let ctx = ctx.clone();
                let replies = outbox.clone();
                let mut call = Box::pin(async move {
                    if let Reply::Some(v) = handle_text(&rpc, &ctx, &text, max_batch).await {
                        replies.push(v.to_string());
                    }
                });
                // A call that completes at its first poll (most do: pings, reads, anything
                // that does not wait) is answered from this task, and its reply goes out at
                // the next turn of the loop; one that waits goes on as a task of its own, so
                // the socket keeps being read. It is polled again there at once, with that
                // task's waker.
                if (&mut call).now_or_never().is_none() {
                    #[allow(
                        clippy::disallowed_methods,
                        reason = "a connection or call outside the server's tracker ends when its socket closes"
                    )]
                    tokio::spawn(call);
                }
            }
            Message::Binary(_) => {
                let v = if window.admit(Instant::now(), 1) {
                    RpcError::parse_error()
                } else {
                    crate::metrics::rate_limited(crate::metrics::Limiter::WsMessages);
                    RpcError::rate_limited()
                };
                crate::metrics::rpc_refused(v.code);
                outbox.push(v.response(Value::Null).to_string());
            }
            Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => {}
            Message::Close(_) => break End::PeerClosed,
        }
    };
    state.hub().unregister(conn_id);
    let finish = async {
        match end {
            End::Drop => {}
            // Complete the closing handshake: tungstenite answers with the peer's code.
            End::PeerClosed => {
                let _ = ws.flush().await;
            }
            End::Close(code, reason) => {
                // What was answered before the close still goes out, then the close frame.
                while let Ok(frame) = rx.try_recv() {
                    if ws.feed(Message::Text(frame)).await.is_err() {
                        return;
                    }
                }
                close(ws, code, reason).await;
            }
            End::TooBig => refuse_too_big(ws).await,
        }
    };
    // Boxed: the closing steps (with `discard`'s read buffer) would otherwise be part of the
    // state every idle connection holds for its whole life.
    let finish = Box::pin(finish);
    tokio::select! {
        biased;
        _ = kill.cancelled() => {}
        _ = tokio::time::timeout(CLOSE_SEND_TIMEOUT, finish) => {}
    }
    tracing::debug!(conn = conn_id, "websocket closed");
}

fn close_frame(code: u16, reason: &'static str) -> Message {
    Message::Close(Some(CloseFrame {
        code: CloseCode::from(code),
        reason: reason.into(),
    }))
}

/// A message past the byte cap: 1009, then its bytes are read and thrown away unparsed until
/// the client goes (the caller bounds the time).
pub(crate) async fn refuse_too_big(mut ws: Socket) {
    if ws
        .send(close_frame(CLOSE_TOO_BIG, TOO_BIG_REASON))
        .await
        .is_ok()
    {
        discard(ws.get_mut()).await;
    }
}

/// Sends a close frame and waits for the peer's, bounded: a client that does not read or
/// answer is dropped after [`CLOSE_SEND_TIMEOUT`].
pub(crate) async fn close(mut ws: Socket, code: u16, reason: &'static str) {
    let _ = tokio::time::timeout(CLOSE_SEND_TIMEOUT, async {
        if ws.send(close_frame(code, reason)).await.is_ok() {
            while let Some(Ok(_)) = ws.next().await {}
        }
    })
    .await;
}

/// Reads and throws away what the client is still sending (the rest of a refused message)
/// until it closes, so the close frame is not lost to a reset; the caller bounds the time.
async fn discard(io: &mut poem::Upgraded) {
    let mut sink = [0u8; 4096];
    while let Ok(n) = io.read(&mut sink).await {
        if n == 0 {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::socket_config;

    #[test]
    fn the_byte_cap_is_four_bytes_per_character_and_saturates() {
        let c = socket_config(1_048_576);
        assert_eq!(c.max_message_size, Some(4 * 1_048_576));
        assert_eq!(c.max_frame_size, Some(4 * 1_048_576));
        assert_eq!(c.read_buffer_size, super::READ_BUFFER);
        assert_eq!(socket_config(usize::MAX).max_message_size, Some(usize::MAX));
    }
}

#[cfg(test)]
mod state_size {
    /// The size of the future an async fn of four arguments returns.
    fn size_of_future<A, B, C, D, F, Fut>(_: F) -> usize
    where
        F: FnOnce(A, B, C, D) -> Fut,
    {
        std::mem::size_of::<Fut>()
    }

    /// Every idle connection holds its task's whole state: the closing steps (and the 4 KiB
    /// read buffer of `discard`) are boxed so they are not part of it. Debug builds lay
    /// futures out larger than release builds; 6.3 KiB before the boxing.
    #[test]
    fn an_idle_connection_state_stays_small() {
        let size = size_of_future(super::connection);
        assert!(size <= 2048, "connection future: {size} bytes");
    }
}
