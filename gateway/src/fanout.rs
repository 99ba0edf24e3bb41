//! Cross-node fan-out over PostgreSQL `LISTEN/NOTIFY`: several gateway nodes sharing one
//! database behave as one gateway. What one node publishes reaches the others:
//!
//! - `gw_events`: system events (`/api/events`, `/api/activity`), batched;
//! - `gw_push`: server pushes to a client id's WebSocket connections (`session.completed`);
//! - `gw_control`: "agents/providers changed" (sent by the store after a registry write), so
//!   every node reloads them.
//!
//! Every payload is JSON `{"v":1,"from":<node>,...}`; a node ignores its own. PostgreSQL refuses
//! a payload of 8000 bytes or more, so a larger body is written to the `fanout` table and the
//! notification carries `{"ref":<id>}` instead (rows are swept after [`SPILL_KEEP_MS`]).
//!
//! Delivery is best effort, like the local event bus: a node whose notification connection
//! drops reconnects with backoff, reloads agents and providers, and publishes
//! `system:fanout_resumed` so event-stream clients know they may have missed events from other
//! nodes meanwhile. Nothing here ever stops the node.

use std::sync::{Arc, Weak};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions};
use tokio::sync::mpsc;

use crate::events::Event;
use crate::events::EventBus;
use crate::hub::Hub;

pub const EVENTS: &str = "gw_events";
pub const PUSH: &str = "gw_push";
use crate::store::nodes::CONTROL;

/// Largest payload sent inline (PostgreSQL's limit is 8000 bytes).
pub const INLINE_MAX: usize = 7000;
/// How long a spilled body is kept for the nodes to read it.
pub const SPILL_KEEP_MS: i64 = 10 * 60 * 1000;
/// Events waiting to be sent at most; past it, events stay local (and a warning is logged).
const QUEUE: usize = 10_000;
/// How long outgoing events gather into one notification.
const GATHER: Duration = Duration::from_millis(10);

/// The process the fan-out delivers to: what other nodes send reaches it through these calls
/// (the process-wide control block implements it), so the fan-out never imports the engine.
pub trait Node: Send + Sync + 'static {
    /// This process's node id (notifications it sent itself are ignored).
    fn node_id(&self) -> &Arc<str>;
    /// The event bus: local events go out, remote ones come in.
    fn events(&self) -> &EventBus;
    /// The push hub: server pushes for a client id's connections on this node.
    fn hub(&self) -> &Hub;
    /// Another node announced a change on the control channel (`what` names it).
    fn announced(&self, what: Option<&str>);
    /// Notifications may have been missed: look again at everything another node may change.
    fn resync(&self);
}

/// The sending side, held by `Control`.
pub struct Fanout {
    push: mpsc::Sender<String>,
    node: Arc<str>,
}

#[derive(Serialize)]
struct WireEvent<'a> {
    n: &'a str,
    t: i64,
    o: Option<&'a str>,
    d: &'a RawValue,
}

#[derive(Deserialize)]
struct Envelope {
    #[serde(default)]
    from: String,
    #[serde(rename = "ref")]
    spilled: Option<i64>,
    #[serde(default)]
    e: Vec<InEvent>,
    c: Option<String>,
    m: Option<String>,
    p: Option<Value>,
    /// What a control message says changed (`agents`, `providers`, `scheduler`).
    what: Option<String>,
}

#[derive(Deserialize)]
struct InEvent {
    n: String,
    t: i64,
    o: Option<String>,
    d: Box<RawValue>,
}

impl Fanout {
    /// Starts the fan-out of this process on the database the store's `options` reach: a
    /// small pool of its own for sending (a server generation's pool closes at each restart)
    /// and a listener connection. `control` delivers what other nodes send.
    pub fn start<N: Node>(options: &PgConnectOptions, control: &Arc<N>) -> Self {
        let node = control.node_id().clone();
        let send = PgPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(Duration::from_secs(3))
            .connect_lazy_with(options.clone().application_name("agent-gateway-fanout"));
        let listen = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(5))
            .connect_lazy_with(
                options
                    .clone()
                    .application_name(&format!("agent-gateway-listener:{node}")),
            );
        let (events_tx, events_rx) = mpsc::channel(QUEUE);
        let (push_tx, push_rx) = mpsc::channel(QUEUE);
        control.events().forward_to(events_tx);
        #[allow(
            clippy::disallowed_methods,
            reason = "process-wide: the sender ends when its channel closes, the listener when the control block is dropped"
        )]
        tokio::spawn(send_loop(send.clone(), node.clone(), events_rx, push_rx));
        let weak: Weak<dyn Node> = Arc::downgrade(control) as Weak<N>;
        #[allow(
            clippy::disallowed_methods,
            reason = "process-wide: the sender ends when its channel closes, the listener when the control block is dropped"
        )]
        tokio::spawn(listen_loop(listen, send, weak));
        Self {
            push: push_tx,
            node,
        }
    }

    /// Sends a push for `client_id`'s connections on the other nodes.
    pub fn push(&self, client_id: &str, method: &str, params: &Value) {
        let body = serde_json::json!({"v": 1, "from": &*self.node, "c": client_id, "m": method, "p": params});
        if self.push.try_send(body.to_string()).is_err() {
            tracing::warn!(
                method,
                "fan-out queue full: a push reaches this node's connections only"
            );
        }
    }
}

/// Sends queued events (batched) and pushes, one notification each, spilling large bodies.
async fn send_loop(
    pool: PgPool,
    node: Arc<str>,
    mut events: mpsc::Receiver<Arc<Event>>,
    mut pushes: mpsc::Receiver<String>,
) {
    let head = format!("{{\"v\":1,\"from\":{},\"e\":[", Value::from(&*node));
    loop {
        tokio::select! {
            first = events.recv() => {
                let Some(first) = first else { return };
                tokio::time::sleep(GATHER).await;
                let mut batch = vec![first];
                while let Ok(e) = events.try_recv() {
                    batch.push(e);
                    if batch.len() >= 500 {
                        break;
                    }
                }
                for body in event_bodies(&head, &batch) {
                    send(&pool, &node, EVENTS, &body).await;
                }
            }
            body = pushes.recv() => {
                let Some(body) = body else { return };
                send(&pool, &node, PUSH, &body).await;
            }
        }
    }
}

/// The notification bodies for `batch`: as many events per body as fit in [`INLINE_MAX`]
/// (an event larger than that alone in its body, which is then spilled).
fn event_bodies(head: &str, batch: &[Arc<Event>]) -> Vec<String> {
    let mut out = Vec::new();
    let mut body = String::new();
    for e in batch {
        let wire = WireEvent {
            n: &e.name,
            t: e.ts,
            o: e.owner.as_deref(),
            d: e.data(),
        };
        let Ok(one) = serde_json::to_string(&wire) else {
            continue;
        };
        if !body.is_empty() && body.len() + one.len() + 2 > INLINE_MAX {
            body.push_str("]}");
            out.push(std::mem::take(&mut body));
        }
        if body.is_empty() {
            body.push_str(head);
        } else {
            body.push(',');
        }
        body.push_str(&one);
    }
    if !body.is_empty() {
        body.push_str("]}");
        out.push(body);
    }
    out
}

/// One notification; a body over [`INLINE_MAX`] goes to the `fanout` table first. Failures
/// are logged: the other nodes miss this one (they are told when they reconnect).
async fn send(pool: &PgPool, node: &str, channel: &str, body: &str) {
    let sent = if body.len() <= INLINE_MAX {
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(channel)
            .bind(body)
            .execute(pool)
            .await
    } else {
        sqlx::query(
            "WITH f AS (INSERT INTO fanout (channel, origin, payload, created_at) \
             VALUES ($1, $2, $3, $4) RETURNING id) \
             SELECT pg_notify($1, json_build_object('v', 1, 'from', $2::text, 'ref', f.id)::text) FROM f",
        )
        .bind(channel)
        .bind(node)
        .bind(body)
        .bind(crate::clock::now_ms())
        .execute(pool)
        .await
    };
    if let Err(e) = sent {
        tracing::warn!(channel, error = %e, "fan-out notification not sent; other nodes miss it");
    }
}

/// Listens until the process ends, reconnecting with backoff (1 s doubling to 10 s).
async fn listen_loop(listen: PgPool, read: PgPool, control: Weak<dyn Node>) {
    let mut backoff = Duration::from_secs(1);
    let mut down_since: Option<i64> = None;
    let mut first = true;
    loop {
        let mut listener = match connect(&listen).await {
            Ok(l) => l,
            Err(e) => {
                if control.strong_count() == 0 {
                    return;
                }
                tracing::warn!(error = %e, "fan-out listener cannot connect; retrying");
                down_since.get_or_insert_with(crate::clock::now_ms);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(10));
                continue;
            }
        };
        backoff = Duration::from_secs(1);
        let Some(strong) = control.upgrade() else {
            return;
        };
        match down_since.take() {
            Some(since) => resynchronise(&*strong, since),
            // Listening only now: a change another node announced between this node's start and
            // this moment was not heard, so registries and timers look again (no gap to report).
            None if first => reload(&*strong),
            None => {}
        }
        first = false;
        drop(strong);
        loop {
            match listener.try_recv().await {
                Ok(Some(n)) => {
                    let Some(control) = control.upgrade() else {
                        return;
                    };
                    receive(&*control, &read, n.channel(), n.payload()).await;
                }
                // The connection was lost: start again with a fresh one.
                Ok(None) | Err(_) => {
                    tracing::warn!("fan-out listener connection lost; reconnecting");
                    down_since = Some(crate::clock::now_ms());
                    break;
                }
            }
        }
    }
}

async fn connect(pool: &PgPool) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    // A lost connection is reported (Ok(None)) and replaced here, with a resynchronisation.
    listener.eager_reconnect(false);
    listener.listen_all([EVENTS, PUSH, CONTROL]).await?;
    Ok(listener)
}

/// Reloads what another node may have changed unheard: registries, and the scheduler's view.
fn reload(control: &dyn Node) {
    control.resync();
}

/// After a gap: reload what may have changed, and tell event-stream clients.
fn resynchronise(control: &dyn Node, down_since: i64) {
    reload(control);
    let down_ms = crate::clock::now_ms() - down_since;
    tracing::info!(down_ms, "fan-out listener reconnected; registries reloaded");
    control.events().publish(
        "system:fanout_resumed",
        serde_json::json!({"downMs": down_ms, "node": &**control.node_id()}),
    );
}

async fn receive(control: &dyn Node, read: &PgPool, channel: &str, payload: &str) {
    let Ok(mut env) = serde_json::from_str::<Envelope>(payload) else {
        tracing::warn!(channel, "unreadable fan-out notification ignored");
        return;
    };
    if env.from == **control.node_id() {
        return;
    }
    if let Some(id) = env.spilled {
        let body: Result<String, _> =
            sqlx::query_scalar("SELECT payload FROM fanout WHERE id = $1")
                .bind(id)
                .fetch_one(read)
                .await;
        match body.map(|b| serde_json::from_str::<Envelope>(&b)) {
            Ok(Ok(full)) => env = full,
            Ok(Err(_)) | Err(_) => {
                tracing::warn!(
                    channel,
                    id,
                    "spilled fan-out notification unreadable; ignored"
                );
                return;
            }
        }
    }
    match channel {
        EVENTS => {
            for e in env.e {
                control
                    .events()
                    .publish_remote(e.n, e.t, e.o.map(Arc::from), e.d);
            }
        }
        PUSH => {
            if let (Some(c), Some(m), Some(p)) = (env.c, env.m, env.p) {
                control.hub().notify_client(&c, &m, p);
            }
        }
        CONTROL => control.announced(env.what.as_deref()),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::events::EventBus;

    #[test]
    fn event_batches_stay_under_the_notify_limit_and_large_events_go_alone() {
        let bus = EventBus::new(64);
        let mut rx = bus.subscribe();
        for i in 0..40 {
            bus.publish(
                "message:sent",
                serde_json::json!({"i": i, "pad": "x".repeat(300)}),
            );
        }
        bus.publish("message:sent", serde_json::json!({"big": "y".repeat(9000)}));
        let mut batch = Vec::new();
        while let Ok(e) = rx.try_recv() {
            batch.push(e);
        }
        let bodies = event_bodies("{\"v\":1,\"from\":\"n\",\"e\":[", &batch);
        let mut seen = 0;
        for (i, b) in bodies.iter().enumerate() {
            let env: Envelope = serde_json::from_str(b).unwrap();
            seen += env.e.len();
            if i + 1 < bodies.len() {
                assert!(b.len() <= INLINE_MAX, "{}", b.len());
            } else {
                assert_eq!(env.e.len(), 1);
                assert!(b.len() > INLINE_MAX);
            }
        }
        assert_eq!(seen, 41);
        assert!(bodies.len() >= 3);
    }
}
