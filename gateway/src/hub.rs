//! Open WebSocket connections of the process, for server push and heartbeats: every frame a
//! connection sends goes through its bounded [`Outbox`], which never waits (a client that
//! stops reading fills it and is dropped); and the [`ConnTicket`] that ties an upgraded
//! socket to its connection slot and server generation.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use tokio::sync::mpsc::{self, error::TrySendError};
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// A text frame: shared bytes, so one notification queued on many connections is one buffer.
pub use tokio_tungstenite::tungstenite::Utf8Bytes as Frame;

/// Frames queued per connection. Replies and pushes queue here while the socket is busy; a
/// client that lets this many pile up is not reading and is dropped.
pub const OUTBOUND_QUEUE: usize = 128;

/// The sending side of one connection's queue.
#[derive(Clone)]
pub struct Outbox {
    tx: mpsc::Sender<Frame>,
    kick: CancellationToken,
    revoked: CancellationToken,
}

impl Outbox {
    pub fn new(capacity: usize) -> (Self, mpsc::Receiver<Frame>) {
        let (tx, rx) = mpsc::channel(capacity);
        let kick = CancellationToken::new();
        let revoked = CancellationToken::new();
        (Self { tx, kick, revoked }, rx)
    }

    /// Queues a frame without waiting. A full queue means the client stopped reading: the
    /// connection is told to drop (see [`Outbox::kicked`]) and the frame is discarded.
    /// Returns whether the frame was queued.
    pub fn push(&self, frame: impl Into<Frame>) -> bool {
        match self.tx.try_send(frame.into()) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) => {
                self.kick.cancel();
                false
            }
            Err(TrySendError::Closed(_)) => false,
        }
    }

    /// Cancelled when a push found the queue full.
    pub fn kicked(&self) -> &CancellationToken {
        &self.kick
    }

    /// Cancelled when the token the connection authenticated with was revoked or rotated:
    /// the connection closes with 4001.
    pub fn revoked(&self) -> &CancellationToken {
        &self.revoked
    }
}

/// What the accept loop attaches to a `/ws` request: the connection's slot under
/// `gateway.maxConnections` (held by the upgraded socket, so WebSockets count too) and its
/// generation's task tracker and kill switch (so the generation's shutdown waits for its
/// WebSockets, and drops them when the grace period is over).
#[derive(Clone)]
pub struct ConnTicket {
    pub slot: Arc<OwnedSemaphorePermit>,
    pub tracker: TaskTracker,
    pub kill: CancellationToken,
}

struct Conn {
    client_id: String,
    outbox: Outbox,
}

#[derive(Default)]
pub struct Hub {
    next: AtomicU64,
    conns: Mutex<HashMap<u64, Conn>>,
}

fn notification(method: &str, params: Value) -> Frame {
    Frame::from(json!({"jsonrpc": "2.0", "method": method, "params": params}).to_string())
}

impl Hub {
    pub fn register(&self, client_id: &str, outbox: Outbox) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        if let Ok(mut c) = self.conns.lock() {
            c.insert(
                id,
                Conn {
                    client_id: client_id.to_owned(),
                    outbox,
                },
            );
        }
        id
    }

    pub fn unregister(&self, id: u64) {
        if let Ok(mut c) = self.conns.lock() {
            c.remove(&id);
        }
    }

    /// Tells every connection of `client_id` that its token no longer works (they close
    /// with 4001); how many there were.
    pub fn revoke_client(&self, client_id: &str) -> usize {
        let Ok(conns) = self.conns.lock() else {
            return 0;
        };
        let mut n = 0;
        for c in conns.values().filter(|c| c.client_id == client_id) {
            c.outbox.revoked.cancel();
            n += 1;
        }
        n
    }

    pub fn count(&self) -> usize {
        self.conns.lock().map(|c| c.len()).unwrap_or(0)
    }

    /// Sends a notification to the connections of `client_id`, or to all when `None` or when
    /// that client has no open connection. Returns how many connections it was queued on; a
    /// connection whose queue is full misses it and is dropped (it stopped reading).
    pub fn notify(&self, client_id: Option<&str>, method: &str, params: Value) -> usize {
        let frame = notification(method, params);
        let Ok(conns) = self.conns.lock() else {
            return 0;
        };
        let targeted: Vec<&Conn> = match client_id {
            Some(id) => conns.values().filter(|c| c.client_id == id).collect(),
            None => Vec::new(),
        };
        let targets: Vec<&Conn> = if targeted.is_empty() {
            conns.values().collect()
        } else {
            targeted
        };
        targets
            .into_iter()
            .filter(|c| c.outbox.push(frame.clone()))
            .count()
    }

    /// Sends a notification only to the connections of `client_id` (never broadcast: for
    /// payloads that belong to one client, such as run results). Returns how many.
    pub fn notify_client(&self, client_id: &str, method: &str, params: Value) -> usize {
        let frame = notification(method, params);
        let Ok(conns) = self.conns.lock() else {
            return 0;
        };
        conns
            .values()
            .filter(|c| c.client_id == client_id)
            .filter(|c| c.outbox.push(frame.clone()))
            .count()
    }

    /// One `heartbeat` notification (`params.ts`, epoch ms) to every connection: one shared
    /// ticker instead of a timer task per socket. Returns how many got it.
    pub fn heartbeat(&self) -> usize {
        let ts = chrono::Utc::now().timestamp_millis();
        self.notify(None, "heartbeat", json!({"ts": ts}))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_full_queue_kicks_the_connection_and_drops_the_frame() {
        let (outbox, mut rx) = Outbox::new(2);
        assert!(outbox.push("a".to_owned()));
        assert!(outbox.push("b".to_owned()));
        assert!(!outbox.kicked().is_cancelled());
        assert!(!outbox.push("c".to_owned()), "one past the queue");
        assert!(outbox.kicked().is_cancelled());
        assert_eq!(rx.try_recv().unwrap().as_str(), "a");
        assert_eq!(rx.try_recv().unwrap().as_str(), "b");
        assert!(rx.try_recv().is_err(), "the refused frame was not queued");
    }

    #[test]
    fn heartbeats_reach_every_connection_and_a_stuck_one_is_kicked() {
        let hub = Hub::default();
        let (fast, mut fast_rx) = Outbox::new(1);
        let (stuck, _stuck_rx) = Outbox::new(1);
        hub.register("a", fast.clone());
        hub.register("b", stuck.clone());
        assert_eq!(hub.heartbeat(), 2);
        let v: Value = serde_json::from_str(fast_rx.try_recv().unwrap().as_str()).unwrap();
        assert_eq!(v["method"], "heartbeat");
        assert!(v["params"]["ts"].as_i64().unwrap() > 0);
        assert_eq!(hub.heartbeat(), 1, "the unread queue is full");
        assert!(stuck.kicked().is_cancelled());
        assert!(!fast.kicked().is_cancelled());
    }
}
