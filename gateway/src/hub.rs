//! Open WebSocket connections and event streams of the process: WebSockets for server push
//! and heartbeats (every frame a connection sends goes through its bounded [`Outbox`], which
//! never waits: a client that stops reading fills it and is dropped), SSE streams of API tokens
//! so that they can be ended (see [`StreamWatch`]), one timer that ends the connections of a
//! token at its `expiresAt`, and the [`ConnTicket`] that ties an upgraded socket to its
//! connection slot and server generation.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::mpsc::{self, error::TrySendError};
use tokio::sync::{Notify, OwnedSemaphorePermit};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::api::principal::Principal;

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
    principal: Principal,
    outbox: Outbox,
}

/// An open event stream: ended through `revoked`.
struct Stream {
    principal: Principal,
    revoked: CancellationToken,
}

#[derive(Default)]
struct Registry {
    ws: HashMap<u64, Conn>,
    streams: HashMap<u64, Stream>,
    /// `(expiresAt, connection id)` of every open connection whose token expires, earliest
    /// first: what the expiry timer sleeps until.
    deadlines: BTreeSet<(i64, u64)>,
}

impl Registry {
    /// Ends a connection: a WebSocket closes with 4001, a stream ends.
    fn end(&self, id: u64) -> bool {
        if let Some(c) = self.ws.get(&id) {
            c.outbox.revoked.cancel();
            true
        } else if let Some(s) = self.streams.get(&id) {
            s.revoked.cancel();
            true
        } else {
            false
        }
    }
}

struct Inner {
    next: AtomicU64,
    reg: Mutex<Registry>,
    /// Wakes the expiry timer: an earlier deadline was added, or the hub is gone.
    rearm: Arc<Notify>,
    /// Whether the expiry timer runs (started by the first connection whose token expires).
    timer: AtomicBool,
}

impl Default for Inner {
    fn default() -> Self {
        Self {
            next: AtomicU64::new(0),
            reg: Mutex::default(),
            rearm: Arc::new(Notify::new()),
            timer: AtomicBool::new(false),
        }
    }
}

impl Drop for Inner {
    /// The timer holds the hub weakly and ends when it wakes and finds it gone.
    fn drop(&mut self) {
        self.rearm.notify_one();
    }
}

impl Inner {
    /// Ends the connections whose token expired by `now`; the next deadline, if any.
    fn expire_due(&self, now: i64) -> Option<i64> {
        let mut reg = self.reg.lock().ok()?;
        while let Some(&(at, id)) = reg.deadlines.first() {
            if at > now {
                return Some(at);
            }
            reg.deadlines.remove(&(at, id));
            if reg.end(id) {
                tracing::info!(conn = id, "token expired: its connection is ended");
            }
        }
        None
    }

    fn forget_stream(&self, id: u64) {
        if let Ok(mut reg) = self.reg.lock() {
            if let Some(s) = reg.streams.remove(&id) {
                if let Some(at) = s.principal.expires_at() {
                    reg.deadlines.remove(&(at, id));
                }
            }
        }
    }
}

/// The one expiry timer of a hub: sleeps until the earliest `expiresAt` among open
/// connections, ends what is due, and sleeps again; woken early when a connection with an
/// earlier deadline registers. Nothing runs per frame or per request, and nothing wakes while
/// no open connection's token expires.
async fn expire(hub: Weak<Inner>, rearm: Arc<Notify>) {
    loop {
        let next = {
            let Some(inner) = hub.upgrade() else {
                return;
            };
            inner.expire_due(crate::clock::now_ms())
        };
        match next {
            Some(at) => {
                let wait = u64::try_from(at - crate::clock::now_ms()).unwrap_or(0);
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(wait)) => {}
                    _ = rearm.notified() => {}
                }
            }
            None => rearm.notified().await,
        }
    }
}

/// An event stream's registration with the hub: `revoked` fires when the stream's token is
/// revoked, rotated or expires (on any node); dropping it (the stream ended) unregisters it.
pub struct StreamWatch {
    hub: Arc<Inner>,
    id: u64,
    principal: Principal,
    revoked: CancellationToken,
}

impl StreamWatch {
    /// Cancelled when the stream must end.
    pub fn revoked(&self) -> &CancellationToken {
        &self.revoked
    }

    /// Why it ended, for the stream's last words.
    pub fn reason(&self) -> &'static str {
        if self.principal.expired() {
            "token expired"
        } else {
            "token revoked"
        }
    }
}

impl Drop for StreamWatch {
    fn drop(&mut self) {
        self.hub.forget_stream(self.id);
    }
}

/// The registry of open connections (shared with its expiry timer and the streams' watches).
#[derive(Default)]
pub struct Hub {
    inner: Arc<Inner>,
}

fn notification(method: &str, params: Value) -> Frame {
    Frame::from(json!({"jsonrpc": "2.0", "method": method, "params": params}).to_string())
}

impl Hub {
    /// Adds the deadline of connection `id` (under the registry's lock), waking the timer when
    /// it is the earliest; starts the timer with the first.
    fn add_deadline(&self, reg: &mut Registry, principal: &Principal, id: u64) {
        let Some(at) = principal.expires_at() else {
            return;
        };
        reg.deadlines.insert((at, id));
        if reg.deadlines.first() == Some(&(at, id)) {
            // A stored permit: a timer computing its next sleep right now still sees it.
            self.inner.rearm.notify_one();
        }
        if !self.inner.timer.swap(true, Ordering::AcqRel) {
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => {
                    rt.spawn(expire(
                        Arc::downgrade(&self.inner),
                        self.inner.rearm.clone(),
                    ));
                }
                Err(_) => self.inner.timer.store(false, Ordering::Release),
            }
        }
    }

    fn next_id(&self) -> u64 {
        self.inner.next.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Registers a WebSocket of `principal`; its id (for [`Hub::unregister`]).
    pub fn register(&self, principal: &Principal, outbox: Outbox) -> u64 {
        let id = self.next_id();
        if let Ok(mut reg) = self.inner.reg.lock() {
            self.add_deadline(&mut reg, principal, id);
            reg.ws.insert(
                id,
                Conn {
                    principal: principal.clone(),
                    outbox,
                },
            );
        }
        id
    }

    pub fn unregister(&self, id: u64) {
        if let Ok(mut reg) = self.inner.reg.lock() {
            if let Some(c) = reg.ws.remove(&id) {
                if let Some(at) = c.principal.expires_at() {
                    reg.deadlines.remove(&(at, id));
                }
            }
        }
    }

    /// Registers an event stream of `principal`, ended like its WebSockets (see
    /// [`crate::auth::ApiTokens::watch`], which also checks the token is still live).
    pub fn watch_stream(&self, principal: &Principal) -> StreamWatch {
        let id = self.next_id();
        let revoked = CancellationToken::new();
        if let Ok(mut reg) = self.inner.reg.lock() {
            self.add_deadline(&mut reg, principal, id);
            reg.streams.insert(
                id,
                Stream {
                    principal: principal.clone(),
                    revoked: revoked.clone(),
                },
            );
        }
        StreamWatch {
            hub: self.inner.clone(),
            id,
            principal: principal.clone(),
            revoked,
        }
    }

    /// Ends every connection of `client_id` whose principal `keep` does not accept: its
    /// WebSockets close with 4001, its event streams end. How many.
    pub fn revoke(&self, client_id: &str, keep: impl Fn(&Principal) -> bool) -> usize {
        let Ok(reg) = self.inner.reg.lock() else {
            return 0;
        };
        let mut n = 0;
        for c in reg.ws.values() {
            if c.principal.client_id == client_id && !keep(&c.principal) {
                c.outbox.revoked.cancel();
                n += 1;
            }
        }
        for s in reg.streams.values() {
            if s.principal.client_id == client_id && !keep(&s.principal) {
                s.revoked.cancel();
                n += 1;
            }
        }
        n
    }

    /// Open WebSockets.
    pub fn count(&self) -> usize {
        self.inner.reg.lock().map(|r| r.ws.len()).unwrap_or(0)
    }

    /// Open event streams of API tokens (those registered to be ended on revocation).
    pub fn streams(&self) -> usize {
        self.inner.reg.lock().map(|r| r.streams.len()).unwrap_or(0)
    }

    /// Sends a notification to the connections of `client_id`, or to all when `None` or when
    /// that client has no open connection. Returns how many connections it was queued on; a
    /// connection whose queue is full misses it and is dropped (it stopped reading).
    pub fn notify(&self, client_id: Option<&str>, method: &str, params: Value) -> usize {
        let frame = notification(method, params);
        let Ok(reg) = self.inner.reg.lock() else {
            return 0;
        };
        let targeted: Vec<&Conn> = match client_id {
            Some(id) => reg
                .ws
                .values()
                .filter(|c| c.principal.client_id == id)
                .collect(),
            None => Vec::new(),
        };
        let targets: Vec<&Conn> = if targeted.is_empty() {
            reg.ws.values().collect()
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
        let Ok(reg) = self.inner.reg.lock() else {
            return 0;
        };
        reg.ws
            .values()
            .filter(|c| c.principal.client_id == client_id)
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

    fn config(id: &str) -> Principal {
        Principal::new(id, crate::api::scopes::Scopes::all())
    }

    fn api(id: &str, expires_at: Option<i64>) -> Principal {
        Principal::api(id, crate::api::scopes::Scopes::all(), expires_at)
    }

    #[test]
    fn heartbeats_reach_every_connection_and_a_stuck_one_is_kicked() {
        let hub = Hub::default();
        let (fast, mut fast_rx) = Outbox::new(1);
        let (stuck, _stuck_rx) = Outbox::new(1);
        hub.register(&config("a"), fast.clone());
        hub.register(&config("b"), stuck.clone());
        let _stream = hub.watch_stream(&api("a", None));
        assert_eq!(hub.heartbeat(), 2, "event streams get no JSON-RPC frames");
        let v: Value = serde_json::from_str(fast_rx.try_recv().unwrap().as_str()).unwrap();
        assert_eq!(v["method"], "heartbeat");
        assert!(v["params"]["ts"].as_i64().unwrap() > 0);
        assert_eq!(hub.heartbeat(), 1, "the unread queue is full");
        assert!(stuck.kicked().is_cancelled());
        assert!(!fast.kicked().is_cancelled());
    }

    #[test]
    fn revoking_ends_the_clients_websockets_and_streams_but_keeps_a_live_secret() {
        let hub = Hub::default();
        let old = api("app", None);
        let rotated = api("app", None);
        let other = api("other", None);
        let (ws_old, _rx1) = Outbox::new(1);
        let (ws_new, _rx2) = Outbox::new(1);
        let (ws_other, _rx3) = Outbox::new(1);
        hub.register(&old, ws_old.clone());
        hub.register(&rotated, ws_new.clone());
        hub.register(&other, ws_other.clone());
        let s_old = hub.watch_stream(&old);
        let s_new = hub.watch_stream(&rotated);
        let s_other = hub.watch_stream(&other);
        assert_eq!(hub.streams(), 3);
        assert_eq!(hub.revoke("app", |p| p.same(&rotated)), 2);
        assert!(ws_old.revoked().is_cancelled() && s_old.revoked().is_cancelled());
        assert!(!ws_new.revoked().is_cancelled() && !s_new.revoked().is_cancelled());
        assert!(!ws_other.revoked().is_cancelled() && !s_other.revoked().is_cancelled());
        assert_eq!(s_old.reason(), "token revoked");
        drop(s_old);
        assert_eq!(hub.streams(), 2, "a dropped watch unregisters its stream");
    }

    /// Waits for `token` at most `within`; whether it fired.
    async fn fires(token: &CancellationToken, within: Duration) -> bool {
        tokio::time::timeout(within, token.cancelled())
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn one_timer_ends_connections_at_their_tokens_expiry() {
        let hub = Hub::default();
        let now = crate::clock::now_ms();
        let late = api("late", Some(now + 400));
        let (ws_late, _rx1) = Outbox::new(1);
        hub.register(&late, ws_late.clone());
        let s_late = hub.watch_stream(&late);
        // Registered after, due before: the timer is re-armed for it.
        let soon = api("soon", Some(now + 150));
        let (ws_soon, _rx2) = Outbox::new(1);
        hub.register(&soon, ws_soon.clone());
        let s_soon = hub.watch_stream(&soon);
        // Never expires; and one that left before its expiry leaves no deadline behind.
        let (ws_forever, _rx3) = Outbox::new(1);
        hub.register(&api("forever", None), ws_forever.clone());
        let gone = hub.register(&api("gone", Some(now + 100)), Outbox::new(1).0);
        hub.unregister(gone);
        assert!(!ws_soon.revoked().is_cancelled());
        assert!(fires(ws_soon.revoked(), Duration::from_millis(1000)).await);
        assert!(crate::clock::now_ms() >= now + 150, "not before its expiry");
        assert!(s_soon.revoked().is_cancelled());
        assert_eq!(s_soon.reason(), "token expired");
        assert!(!ws_late.revoked().is_cancelled(), "not yet due");
        assert!(fires(s_late.revoked(), Duration::from_millis(1000)).await);
        assert!(crate::clock::now_ms() >= now + 400);
        assert!(ws_late.revoked().is_cancelled());
        assert!(!ws_forever.revoked().is_cancelled());
        assert!(hub.inner.reg.lock().unwrap().deadlines.is_empty());
    }

    #[tokio::test]
    async fn the_timer_ends_with_its_hub() {
        let hub = Hub::default();
        let weak = Arc::downgrade(&hub.inner);
        let at = crate::clock::now_ms() + 60_000;
        hub.register(&api("a", Some(at)), Outbox::new(1).0);
        tokio::task::yield_now().await;
        drop(hub);
        assert!(weak.upgrade().is_none());
    }
}
