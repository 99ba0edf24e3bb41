//! Conversation identity and history: canonical session keys, transcript rows <-> model
//! messages, trimming history to a model's context window, and one-turn-at-a-time locks.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use crate::rpc::generated::types::{
    SessionMessage, SessionMessageRole, SessionToolCall, TokensUsed,
};
use crate::runtime::providers::scripted::estimate_tokens;
use crate::runtime::providers::{ChatMessage, Role, ToolCall};
use crate::store::sessions::MessageRow;

/// Channel label of sessions created through agent.execute without a channelId.
pub const DEFAULT_CHANNEL: &str = "api";
/// User label of sessions whose key names no userId.
pub const DEFAULT_USER: &str = "main";

/// Who a session belongs to, and its canonical key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionIdent {
    pub key: String,
    pub agent_id: String,
    pub channel: String,
    /// The owner of the session: the key's tenant part, or `<channel>:<tenant part>` for the
    /// gateway's own channels (`store::sessions::owner_of`).
    pub tenant_id: String,
    pub user_id: String,
}

use crate::store::sessions::owner_of;
pub use crate::store::sessions::session_key;

impl SessionIdent {
    /// The identity, owner and canonical key ([`session_key`]) of a session.
    pub fn new(agent_id: &str, channel: &str, tenant_id: &str, user_id: &str) -> Self {
        let key = session_key(agent_id, channel, tenant_id, user_id);
        Self {
            key,
            agent_id: agent_id.to_owned(),
            channel: channel.to_owned(),
            tenant_id: owner_of(channel, tenant_id),
            user_id: user_id.to_owned(),
        }
    }
}

/// Serialises turns per session: a second turn on the same session waits for the first.
#[derive(Default)]
pub struct SessionLocks {
    map: Mutex<HashMap<String, Weak<tokio::sync::Mutex<()>>>>,
}

impl SessionLocks {
    pub fn lock_for(&self, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(l) = map.get(key).and_then(Weak::upgrade) {
            return l;
        }
        if map.len() > 1024 {
            map.retain(|_, w| w.strong_count() > 0);
        }
        let l = Arc::new(tokio::sync::Mutex::new(()));
        map.insert(key.to_owned(), Arc::downgrade(&l));
        l
    }
}

/// A stored message as a model message; system rows (compaction summaries) are None.
pub fn to_chat(m: &MessageRow) -> Option<ChatMessage> {
    let role = match m.role.as_str() {
        "user" => Role::User,
        "assistant" => Role::Assistant,
        "tool" => Role::Tool,
        _ => return None,
    };
    let tool_calls: Vec<ToolCall> = m
        .tool_calls
        .as_deref()
        .and_then(|t| serde_json::from_str(t).ok())
        .unwrap_or_default();
    Some(ChatMessage {
        role,
        content: m.content.clone(),
        tool_calls,
        tool_call_id: m.tool_call_id.clone(),
        tool_name: m.tool_name.clone(),
        is_error: m.is_error.unwrap_or(false),
    })
}

/// A model message as a row to store.
pub fn to_row(m: &ChatMessage, model: Option<&str>, usage: Option<(u64, u64)>) -> MessageRow {
    MessageRow {
        seq: 0,
        role: match m.role {
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
        .to_owned(),
        content: m.content.clone(),
        tool_calls: (!m.tool_calls.is_empty())
            .then(|| serde_json::to_string(&m.tool_calls).ok())
            .flatten(),
        tool_call_id: m.tool_call_id.clone(),
        tool_name: m.tool_name.clone(),
        is_error: (m.role == Role::Tool).then_some(m.is_error),
        model: model.map(str::to_owned),
        input_tokens: usage.map(|u| u.0 as i64),
        output_tokens: usage.map(|u| u.1 as i64),
        created_at: crate::store::now_ms(),
    }
}

/// A stored message as the wire's SessionMessage.
pub fn to_wire(m: &MessageRow) -> SessionMessage {
    let role = match m.role.as_str() {
        "user" => SessionMessageRole::User,
        "assistant" => SessionMessageRole::Assistant,
        "tool" => SessionMessageRole::Tool,
        _ => SessionMessageRole::System,
    };
    let calls: Option<Vec<ToolCall>> = m
        .tool_calls
        .as_deref()
        .and_then(|t| serde_json::from_str(t).ok());
    SessionMessage {
        seq: m.seq,
        role,
        content: m.content.clone(),
        timestamp: m.created_at,
        tool_calls: calls.filter(|c| !c.is_empty()).map(|c| {
            c.into_iter()
                .map(|c| SessionToolCall {
                    id: c.id,
                    name: c.name,
                    arguments: c.arguments,
                })
                .collect()
        }),
        tool_call_id: m.tool_call_id.clone(),
        tool_name: m.tool_name.clone(),
        is_error: m.is_error,
        model: m.model.clone(),
        tokens_used: match (m.input_tokens, m.output_tokens) {
            (Some(i), Some(o)) => Some(TokensUsed {
                input: i,
                output: o,
                total: i + o,
            }),
            _ => None,
        },
        delivery_status: None,
    }
}

/// Estimated tokens of a message as sent to a model.
pub fn message_tokens(m: &ChatMessage) -> u64 {
    4 + estimate_tokens(&m.content)
        + m.tool_calls
            .iter()
            .map(|c| estimate_tokens(&c.name) + estimate_tokens(&c.arguments.to_string()))
            .sum::<u64>()
}

/// Keeps the newest history that fits in `budget` tokens, starting at a user message (so a
/// tool result never arrives without the call it answers).
pub fn trim_history(mut history: Vec<ChatMessage>, budget: u64) -> Vec<ChatMessage> {
    let mut total: u64 = history.iter().map(message_tokens).sum();
    let mut start = 0;
    while start < history.len() && total > budget {
        total -= message_tokens(&history[start]);
        start += 1;
    }
    while start < history.len() && history[start].role != Role::User {
        start += 1;
    }
    history.drain(..start);
    history
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_of_distinct_parts_never_collide() {
        let a = SessionIdent::new("a", "api", "t:1", "u");
        let b = SessionIdent::new("a", "api", "t", "1:u");
        assert_ne!(a.key, b.key);
        assert_eq!(a.key, "agent:a:api:t%3A1:u");
        // An escaped colon in a part stays distinct from a colon.
        let c = SessionIdent::new("a%3A", "api", "", "ü:");
        assert_eq!(c.key, "agent:a%253A:api::ü%3A");
        assert_ne!(c.key, SessionIdent::new("a:", "api", "", "ü:").key);
    }

    #[test]
    fn trimming_keeps_the_newest_and_starts_at_a_user_message() {
        let call = ToolCall {
            id: "c".into(),
            name: "t".into(),
            arguments: serde_json::json!({}),
        };
        let h = vec![
            ChatMessage::user("x".repeat(400)),
            ChatMessage::assistant("", vec![call.clone()]),
            ChatMessage::tool(&call, "result", false),
            ChatMessage::assistant("done", vec![]),
            ChatMessage::user("second"),
            ChatMessage::assistant("answer", vec![]),
        ];
        let all: u64 = h.iter().map(message_tokens).sum();
        assert_eq!(trim_history(h.clone(), all).len(), 6);
        let kept = trim_history(h, all - 1);
        assert_eq!(kept.len(), 2);
        assert_eq!(kept[0].content, "second");
    }
}
