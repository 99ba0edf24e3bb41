//! GET /ws-echo, in test builds only (cargo feature `ws-echo`): a WebSocket echo on the same
//! stack as `/ws` (`ws::accept`: the same handshake, tungstenite settings, bearer check,
//! connection slot, generation and shutdown close), so that the RFC 6455 conformance suite
//! (Autobahn, `tests/autobahn/`) tests the WebSocket layer every `/ws` client goes through.

use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use poem::web::Data;
use poem::{Request, Response};
use tokio_tungstenite::tungstenite::error::{CapacityError, Error as WsError};
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;

use super::ws::{
    accept, close, refuse_too_big, Socket, CLOSE_GOING_AWAY, CLOSE_UNAUTHORIZED, SHUTDOWN_REASON,
};
use crate::app::state::AppState;

/// Where the echo is mounted.
pub const PATH: &str = "/ws-echo";

/// How long a refused message's bytes are drained at most (as on /ws).
const DRAIN: Duration = Duration::from_secs(1);

#[poem::handler]
pub async fn upgrade(req: &Request, Data(state): Data<&Arc<AppState>>) -> Response {
    accept(req, state, |state, principal, ws, kill| async move {
        match principal {
            Some(_) => echo(ws, state.stop.clone(), kill).await,
            None => close(ws, CLOSE_UNAUTHORIZED, "Unauthorized").await,
        }
    })
}

/// Sends every data message back as it came; tungstenite itself answers pings, completes the
/// closing handshake and fails the connection on protocol errors. A message past the byte cap
/// gets 1009, as on /ws.
async fn echo(mut socket: Socket, stop: CancellationToken, kill: CancellationToken) {
    loop {
        let msg = tokio::select! {
            _ = kill.cancelled() => return,
            _ = stop.cancelled() => {
                close(socket, CLOSE_GOING_AWAY, SHUTDOWN_REASON).await;
                return;
            }
            m = socket.next() => m,
        };
        let reply = match msg {
            Some(Ok(msg @ (Message::Text(_) | Message::Binary(_)))) => msg,
            // Complete the closing handshake as /ws does: tungstenite queued the answer (the
            // peer's code) when it read the close frame; flushing writes it and ends the
            // stream, and dropping the socket then closes TCP from our side first.
            // (`WebSocketStream::close` would try to send a second close frame and fail with
            // SendAfterClosing, leaving the answer unsent: Autobahn's UNCLEAN closes.)
            Some(Ok(Message::Close(_))) => {
                let _ = tokio::time::timeout(DRAIN, socket.flush()).await;
                return;
            }
            Some(Ok(_)) => continue,
            Some(Err(WsError::Capacity(CapacityError::MessageTooLong { .. }))) => {
                let _ = tokio::time::timeout(DRAIN, refuse_too_big(socket)).await;
                return;
            }
            Some(Err(_)) | None => return,
        };
        if socket.send(reply).await.is_err() {
            return;
        }
    }
}
