//! The in-process event bus: every system event (the names of the spec's "System event
//! stream") is published here once and fanned out to `/api/events` subscribers. Publishing
//! never blocks: each subscriber has a bounded buffer, and one that falls behind is told so
//! and dropped. The most recent events are kept for `/api/activity`.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::Value;
use tokio::sync::{broadcast, mpsc};

use crate::api::principal::OPERATOR;
use crate::api::tenancy::Tenant;

/// Events a subscriber may have queued before it counts as lagging.
pub const SUBSCRIBER_BUFFER: usize = 256;
/// Events kept for the activity feed.
pub const RECENT: usize = 100;

/// Events only operators (admin) see, whoever publishes them: audit records, secret changes,
/// and webhook deliveries (caused by unauthenticated requests; they name paths, mappings and
/// session keys of the whole gateway). Published with the owner
/// [`crate::api::principal::OPERATOR`], an id no token has.
pub fn operator_only(name: &str) -> bool {
    name == "audit:event" || name == "webhook:received" || name.starts_with("secret:")
}

/// What an event carries until somebody reads it: any serializable payload.
trait Payload: Send + Sync {
    fn to_raw(&self) -> serde_json::Result<Box<RawValue>>;
}

impl<T: Serialize + Send + Sync> Payload for T {
    fn to_raw(&self) -> serde_json::Result<Box<RawValue>> {
        serde_json::value::to_raw_value(self)
    }
}

/// One published event, serialized as `/api/events` and `/api/activity` send it.
///
/// The payload is kept as published and written out as JSON the first time a reader asks
/// for it (every later reader gets the same text): most events are never read, and writing
/// out three of them per model call was 4% of a `/v1` request's instructions.
pub struct Event {
    /// Increases by one per event in this process (events from other nodes included).
    pub seq: u64,
    /// The spec's event name, e.g. `message:received`.
    pub name: Cow<'static, str>,
    /// Unix epoch milliseconds.
    pub ts: i64,
    /// The tenant whose session the event concerns; None for a system-wide event. Callers
    /// without admin see only their own tenant's events and the system-wide ones.
    pub owner: Option<Arc<str>>,
    payload: Box<dyn Payload>,
    data: OnceLock<Box<RawValue>>,
}

impl Event {
    /// The payload as JSON text (`null` if it could not be serialized, which is logged).
    pub fn data(&self) -> &RawValue {
        self.data.get_or_init(|| {
            self.payload.to_raw().unwrap_or_else(|e| {
                tracing::error!(event = %self.name, error = %e, "event payload not serializable");
                RawValue::NULL.to_owned()
            })
        })
    }

    /// Whether a subscriber reaching `tenant` may see this event.
    pub fn visible_to(&self, tenant: &Tenant) -> bool {
        self.owner.is_none() || tenant.reaches(self.owner.as_deref())
    }

    /// The payload as a JSON tree.
    pub fn data_value(&self) -> Value {
        serde_json::from_str(self.data().get()).unwrap_or(Value::Null)
    }
}

impl Serialize for Event {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut out = s.serialize_struct("Event", 4)?;
        out.serialize_field("seq", &self.seq)?;
        out.serialize_field("event", &self.name)?;
        out.serialize_field("ts", &self.ts)?;
        out.serialize_field("data", self.data())?;
        out.end()
    }
}

pub struct EventBus {
    tx: broadcast::Sender<Arc<Event>>,
    seq: AtomicU64,
    recent: Mutex<VecDeque<Arc<Event>>>,
    /// Where events published here also go to reach the other nodes (`fanout`), when this
    /// process shares its database; full: the event stays local (logged by the fan-out).
    forward: OnceLock<mpsc::Sender<Arc<Event>>>,
}

impl Default for EventBus {
    fn default() -> Self {
        Self::new(SUBSCRIBER_BUFFER)
    }
}

impl EventBus {
    pub fn new(buffer: usize) -> Self {
        let (tx, _) = broadcast::channel(buffer.max(1));
        Self {
            tx,
            seq: AtomicU64::new(0),
            recent: Mutex::new(VecDeque::with_capacity(RECENT)),
            forward: OnceLock::new(),
        }
    }

    /// From now on every event published here is also handed to `to` (once per process).
    pub fn forward_to(&self, to: mpsc::Sender<Arc<Event>>) {
        let _ = self.forward.set(to);
    }

    /// Publishes a system-wide event (see [`EventBus::publish_owned`]). An operator-only
    /// event ([`operator_only`]) published here still reaches operators only.
    pub fn publish<T: Serialize + Send + Sync + 'static>(&self, name: &'static str, data: T) {
        let owner = operator_only(name).then(|| Arc::from(OPERATOR));
        self.publish_owned(owner, name, data);
    }

    /// Publishes an event of `owner`'s session (None: system-wide) to every current
    /// subscriber and the activity feed. The payload is serialized when first read, not here.
    pub fn publish_owned<T: Serialize + Send + Sync + 'static>(
        &self,
        owner: Option<Arc<str>>,
        name: &'static str,
        data: T,
    ) {
        let event = self.deliver(Event {
            seq: 0,
            name: Cow::Borrowed(name),
            ts: crate::clock::now_ms(),
            owner,
            payload: Box::new(data),
            data: OnceLock::new(),
        });
        if let Some(forward) = self.forward.get() {
            // Serialized by the fan-out task, off the request's path.
            let _ = forward.try_send(event);
        }
    }

    /// Publishes an event of `owner` (a tenant's session, or a principal's work): only that
    /// tenant and admin see it.
    pub fn publish_to<T: Serialize + Send + Sync + 'static>(
        &self,
        owner: &Arc<str>,
        name: &'static str,
        data: T,
    ) {
        self.publish_owned(Some(owner.clone()), name, data);
    }

    /// An event another node published: delivered here like a local one (with this node's
    /// next `seq`), never forwarded again.
    pub fn publish_remote(
        &self,
        name: String,
        ts: i64,
        owner: Option<Arc<str>>,
        data: Box<RawValue>,
    ) {
        let done = OnceLock::new();
        let _ = done.set(data);
        self.deliver(Event {
            seq: 0,
            name: Cow::Owned(name),
            ts,
            owner,
            payload: Box::new(()),
            data: done,
        });
    }

    fn deliver(&self, mut event: Event) -> Arc<Event> {
        event.seq = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
        let event = Arc::new(event);
        if let Ok(mut recent) = self.recent.lock() {
            if recent.len() == RECENT {
                recent.pop_front();
            }
            recent.push_back(event.clone());
        }
        // No subscriber is not an error.
        let _ = self.tx.send(event.clone());
        event
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Event>> {
        self.tx.subscribe()
    }

    /// Open subscriptions (for tests and diagnostics).
    pub fn subscribers(&self) -> usize {
        self.tx.receiver_count()
    }

    /// The newest `limit` events `tenant` may see, newest first.
    pub fn recent(&self, tenant: &Tenant, limit: usize) -> Vec<Arc<Event>> {
        self.recent
            .lock()
            .map(|r| {
                r.iter()
                    .rev()
                    .filter(|e| e.visible_to(tenant))
                    .take(limit)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn all() -> Tenant {
        Tenant::for_principal("admin", true)
    }

    #[test]
    fn a_tenant_sees_its_own_and_system_events_only() {
        let bus = EventBus::new(8);
        bus.publish("system:error", json!(1));
        bus.publish_owned(Some(Arc::from("alice")), "message:sent", json!(2));
        bus.publish_owned(Some(Arc::from("mallory")), "message:sent", json!(3));
        let seen = |t: Tenant| -> Vec<Value> {
            bus.recent(&t, 10).iter().map(|e| e.data_value()).collect()
        };
        assert_eq!(
            seen(Tenant::for_principal("alice", false)),
            [json!(2), json!(1)]
        );
        assert_eq!(
            seen(Tenant::for_principal("mallory", false)),
            [json!(3), json!(1)]
        );
        assert_eq!(seen(all()), [json!(3), json!(2), json!(1)]);
    }

    #[test]
    fn operator_events_published_system_wide_reach_operators_only() {
        let bus = EventBus::new(8);
        bus.publish("audit:event", json!({"kind": "webhook.rejected"}));
        bus.publish("webhook:received", json!({"path": "echo"}));
        bus.publish("secret:rotated", json!({"name": "k"}));
        bus.publish("agent:hot_added", json!({"agentId": "a"}));
        let names = |t: Tenant| -> Vec<String> {
            bus.recent(&t, 10)
                .iter()
                .map(|e| e.name.to_string())
                .collect()
        };
        assert_eq!(
            names(Tenant::for_principal("alice", false)),
            ["agent:hot_added"]
        );
        assert_eq!(names(all()).len(), 4);
    }

    #[tokio::test]
    async fn a_slow_subscriber_lags_without_blocking_the_publisher() {
        let bus = EventBus::new(4);
        let mut slow = bus.subscribe();
        for i in 0..10 {
            bus.publish("system:error", json!({"i": i}));
        }
        assert!(matches!(
            slow.recv().await,
            Err(broadcast::error::RecvError::Lagged(6))
        ));
        let recent = bus.recent(&all(), 3);
        assert_eq!(recent.len(), 3);
        assert_eq!(recent[0].data_value(), json!({"i": 9}));
        assert_eq!(
            serde_json::to_value(&*recent[0]).unwrap(),
            json!({"seq": 10, "event": "system:error", "ts": recent[0].ts, "data": {"i": 9}})
        );
        assert_eq!(recent[0].seq, 10);
    }

    /// Counts how often it is serialized.
    struct Counted(Arc<std::sync::atomic::AtomicUsize>);

    impl Serialize for Counted {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            self.0.fetch_add(1, Ordering::SeqCst);
            s.serialize_str("counted")
        }
    }

    #[tokio::test]
    async fn a_payload_is_serialized_once_and_only_when_read() {
        let bus = EventBus::new(4);
        let count = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        bus.publish("system:error", Counted(count.clone()));
        assert_eq!(count.load(Ordering::SeqCst), 0, "nobody read it yet");
        let mut a = bus.subscribe();
        let mut b = bus.subscribe();
        bus.publish("system:error", Counted(count.clone()));
        let (ea, eb) = (a.recv().await.unwrap(), b.recv().await.unwrap());
        assert_eq!(ea.data().get(), "\"counted\"");
        assert_eq!(
            serde_json::to_value(&*eb).unwrap()["data"],
            json!("counted")
        );
        assert_eq!(bus.recent(&all(), 1)[0].data_value(), json!("counted"));
        assert_eq!(
            count.load(Ordering::SeqCst),
            1,
            "three readers, one serialization"
        );
    }

    /// Fails to serialize.
    struct Broken;

    impl Serialize for Broken {
        fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
            Err(serde::ser::Error::custom("broken"))
        }
    }

    #[test]
    fn a_payload_that_cannot_be_serialized_reads_as_null() {
        let bus = EventBus::new(4);
        bus.publish("system:error", Broken);
        let e = &bus.recent(&all(), 1)[0];
        assert_eq!(e.data().get(), "null");
        assert_eq!(
            serde_json::to_value(&**e).unwrap(),
            json!({"seq": 1, "event": "system:error", "ts": e.ts, "data": null})
        );
    }
}
