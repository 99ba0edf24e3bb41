//! Open WebSocket connections of one server generation, for server push: notifications to
//! one client id's connections, or to everyone when the target is unknown.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use serde_json::{json, Value};
use tokio::sync::mpsc;

/// A frame for a connection's writer.
#[derive(Debug)]
pub enum Outbound {
    Text(String),
    Close(u16, String),
}

struct Conn {
    client_id: String,
    tx: mpsc::Sender<Outbound>,
}

#[derive(Default)]
pub struct Hub {
    next: AtomicU64,
    conns: Mutex<HashMap<u64, Conn>>,
}

impl Hub {
    pub fn register(&self, client_id: &str, tx: mpsc::Sender<Outbound>) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        if let Ok(mut c) = self.conns.lock() {
            c.insert(
                id,
                Conn {
                    client_id: client_id.to_owned(),
                    tx,
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

    pub fn count(&self) -> usize {
        self.conns.lock().map(|c| c.len()).unwrap_or(0)
    }

    /// Sends a notification to the connections of `client_id`, or to all when `None` or when
    /// that client has no open connection. Returns how many connections it was queued on;
    /// a connection whose queue is full misses it (notifications are best effort).
    pub fn notify(&self, client_id: Option<&str>, method: &str, params: Value) -> usize {
        let text = json!({"jsonrpc": "2.0", "method": method, "params": params}).to_string();
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
            .filter(|c| c.tx.try_send(Outbound::Text(text.clone())).is_ok())
            .count()
    }

    /// Sends a notification only to the connections of `client_id` (never broadcast: for
    /// payloads that belong to one client, such as run results). Returns how many.
    pub fn notify_client(&self, client_id: &str, method: &str, params: Value) -> usize {
        let text = json!({"jsonrpc": "2.0", "method": method, "params": params}).to_string();
        let Ok(conns) = self.conns.lock() else {
            return 0;
        };
        conns
            .values()
            .filter(|c| c.client_id == client_id)
            .filter(|c| c.tx.try_send(Outbound::Text(text.clone())).is_ok())
            .count()
    }
}
