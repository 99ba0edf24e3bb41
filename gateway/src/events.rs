//! The in-process event bus: every system event (the names of the spec's "System event
//! stream") is published here once and fanned out to `/api/events` subscribers. Publishing
//! never blocks: each subscriber has a bounded buffer, and one that falls behind is told so
//! and dropped. The most recent events are kept for `/api/activity`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::Value;
use tokio::sync::broadcast;

/// Events a subscriber may have queued before it counts as lagging.
pub const SUBSCRIBER_BUFFER: usize = 256;
/// Events kept for the activity feed.
pub const RECENT: usize = 100;

/// One published event, serialized as `/api/events` and `/api/activity` send it.
#[derive(Debug, Serialize)]
pub struct Event {
    /// Increases by one per event in this process.
    pub seq: u64,
    /// The spec's event name, e.g. `message:received`.
    #[serde(rename = "event")]
    pub name: &'static str,
    /// Unix epoch milliseconds.
    pub ts: i64,
    /// The payload, serialized once when published (every subscriber sends the same text).
    pub data: Box<RawValue>,
}

impl Event {
    /// The payload as a JSON tree.
    pub fn data_value(&self) -> Value {
        serde_json::from_str(self.data.get()).unwrap_or(Value::Null)
    }
}

pub struct EventBus {
    tx: broadcast::Sender<Arc<Event>>,
    seq: AtomicU64,
    recent: Mutex<VecDeque<Arc<Event>>>,
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
        }
    }

    /// Publishes an event to every current subscriber and the activity feed.
    pub fn publish<T: Serialize + ?Sized>(&self, name: &'static str, data: &T) {
        let data = match serde_json::value::to_raw_value(data) {
            Ok(d) => d,
            Err(e) => {
                tracing::error!(event = name, error = %e, "event payload not serializable");
                return;
            }
        };
        let event = Arc::new(Event {
            seq: self.seq.fetch_add(1, Ordering::Relaxed) + 1,
            name,
            ts: crate::store::now_ms(),
            data,
        });
        if let Ok(mut recent) = self.recent.lock() {
            if recent.len() == RECENT {
                recent.pop_front();
            }
            recent.push_back(event.clone());
        }
        // No subscriber is not an error.
        let _ = self.tx.send(event);
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Event>> {
        self.tx.subscribe()
    }

    /// Open subscriptions (for tests and diagnostics).
    pub fn subscribers(&self) -> usize {
        self.tx.receiver_count()
    }

    /// The newest `limit` events, newest first.
    pub fn recent(&self, limit: usize) -> Vec<Arc<Event>> {
        self.recent
            .lock()
            .map(|r| r.iter().rev().take(limit).cloned().collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[tokio::test]
    async fn a_slow_subscriber_lags_without_blocking_the_publisher() {
        let bus = EventBus::new(4);
        let mut slow = bus.subscribe();
        for i in 0..10 {
            bus.publish("system:error", &json!({"i": i}));
        }
        assert!(matches!(
            slow.recv().await,
            Err(broadcast::error::RecvError::Lagged(6))
        ));
        let recent = bus.recent(3);
        assert_eq!(recent.len(), 3);
        assert_eq!(recent[0].data_value(), json!({"i": 9}));
        assert_eq!(
            serde_json::to_value(&*recent[0]).unwrap(),
            json!({"seq": 10, "event": "system:error", "ts": recent[0].ts, "data": {"i": 9}})
        );
        assert_eq!(recent[0].seq, 10);
    }
}
