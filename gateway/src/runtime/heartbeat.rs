//! Heartbeat wakes: outside events (webhook mappings with `action: wake`) queued for an
//! agent's next heartbeat turn, or run in one at once (`wakeMode: now`). A heartbeat turn
//! runs in the agent's heartbeat session with every pending event in its message.
//!
//! Scheduled heartbeat ticks (the `heartbeat.*` methods) are not built yet: events queued with
//! `next-heartbeat` wait for the agent's next heartbeat turn, which today is the next `now`
//! wake.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

/// Pending events kept per agent at most (the oldest are dropped).
pub const MAX_PENDING: usize = 100;

/// The message of every heartbeat turn, before the pending events.
pub const HEARTBEAT_PROMPT: &str =
    "Heartbeat: check for pending work and report anything that needs attention.";

/// Events waiting for each agent's next heartbeat turn.
#[derive(Default)]
pub struct PendingWakes {
    by_agent: Mutex<HashMap<String, VecDeque<String>>>,
}

impl PendingWakes {
    /// Queues an event for `agent`'s next heartbeat turn.
    pub fn push(&self, agent: &str, text: String) {
        let Ok(mut map) = self.by_agent.lock() else {
            return;
        };
        let q = map.entry(agent.to_owned()).or_default();
        if q.len() == MAX_PENDING {
            q.pop_front();
        }
        q.push_back(text);
    }

    /// Takes every event queued for `agent`.
    pub fn take(&self, agent: &str) -> Vec<String> {
        self.by_agent
            .lock()
            .ok()
            .and_then(|mut m| m.remove(agent))
            .map(Vec::from)
            .unwrap_or_default()
    }
}

/// The heartbeat turn's message: the prompt, then each pending event.
pub fn heartbeat_message(events: &[String]) -> String {
    let mut out = HEARTBEAT_PROMPT.to_owned();
    for e in events {
        out.push_str("\n\n");
        out.push_str(e);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_events_are_bounded_and_taken_once() {
        let p = PendingWakes::default();
        for i in 0..(MAX_PENDING + 5) {
            p.push("a", format!("e{i}"));
        }
        let got = p.take("a");
        assert_eq!(got.len(), MAX_PENDING);
        assert_eq!(got.first().map(String::as_str), Some("e5"));
        assert_eq!(p.take("a").len(), 0);
        assert!(p.take("b").is_empty());
        assert!(heartbeat_message(&got).starts_with(HEARTBEAT_PROMPT));
    }
}
