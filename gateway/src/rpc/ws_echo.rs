//! GET /ws-echo, in test builds only (cargo feature `ws-echo`): a WebSocket echo on the same
//! stack as `/ws` (poem's upgrade, the same tungstenite settings, the same bearer check and
//! shutdown close), so that the RFC 6455 conformance suite (Autobahn, `tests/autobahn/`) tests
//! the WebSocket layer every `/ws` client goes through, without JSON-RPC in the way.

use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use poem::web::websocket::{CloseCode, Message, WebSocket, WebSocketConfig, WebSocketStream};
use poem::web::Data;
use poem::{IntoResponse, Request, Response};

use super::ws::{CLOSE_GOING_AWAY, CLOSE_UNAUTHORIZED, SHUTDOWN_REASON};
use crate::config::GatewayConfig;
use crate::state::AppState;

/// Where the echo is mounted.
pub const PATH: &str = "/ws-echo";

/// How long a close frame may take to reach a client that does not read (as on /ws).
const CLOSE_SEND_TIMEOUT: Duration = Duration::from_secs(1);

/// The tungstenite settings of `/ws`, derived from `gateway.wsMaxMessageBytes`.
///
/// `/ws` (rpc/ws.rs) is being given its own derivation in the same issue; when it lands, this
/// function must return exactly what `/ws` uses (call it), so that Autobahn keeps testing the
/// real settings. A message of N characters is at most 4N bytes of UTF-8.
pub fn socket_config(g: &GatewayConfig) -> WebSocketConfig {
    let max_bytes = g.ws_max_message_bytes.saturating_mul(4);
    let mut config = WebSocketConfig::default();
    config.max_message_size = Some(max_bytes);
    config.max_frame_size = Some(max_bytes);
    config
}

#[poem::handler]
pub async fn upgrade(req: &Request, ws: WebSocket, Data(state): Data<&Arc<AppState>>) -> Response {
    let authorized = state.tokens.authenticate(req, true).is_some();
    let stop = state.stop.clone();
    ws.config(socket_config(&state.config.gateway))
        .on_upgrade(move |mut socket| async move {
            if authorized {
                echo(socket, stop).await;
            } else {
                let frame = Message::Close(Some((
                    CloseCode::from(CLOSE_UNAUTHORIZED),
                    "Unauthorized".to_owned(),
                )));
                let _ = tokio::time::timeout(CLOSE_SEND_TIMEOUT, socket.send(frame)).await;
            }
        })
        .into_response()
}

/// Sends every data message back as it came; tungstenite itself answers pings, completes the
/// closing handshake and fails the connection on protocol errors.
async fn echo(mut socket: WebSocketStream, stop: tokio_util::sync::CancellationToken) {
    loop {
        let msg = tokio::select! {
            _ = stop.cancelled() => {
                let frame = Message::Close(Some((
                    CloseCode::from(CLOSE_GOING_AWAY),
                    SHUTDOWN_REASON.to_owned(),
                )));
                let _ = tokio::time::timeout(CLOSE_SEND_TIMEOUT, socket.send(frame)).await;
                return;
            }
            m = socket.next() => m,
        };
        let reply = match msg {
            Some(Ok(msg @ (Message::Text(_) | Message::Binary(_)))) => msg,
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
            // The peer's close: tungstenite has queued the reply, which flushing sends.
            Some(Ok(Message::Close(_))) => {
                let _ = tokio::time::timeout(CLOSE_SEND_TIMEOUT, socket.close()).await;
                return;
            }
            Some(Err(_)) | None => return,
        };
        if socket.send(reply).await.is_err() {
            return;
        }
    }
}
