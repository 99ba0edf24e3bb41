//! Conversation identity and history: canonical session keys, transcript rows <-> model
//! messages, trimming history to a model's context window, and one-turn-at-a-time locks.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use crate::api::error::GatewayError;
use crate::api::generated::types::{
    SessionMessage, SessionMessageRole, SessionToolCall, TokensUsed,
};
use crate::api::principal::Identity;
use crate::providers::tokens::estimate_tokens;
use crate::providers::{ChatMessage, Role, ToolCall};
use crate::store::sessions::{MessageRow, SessionRow};

/// Channel label of sessions created through agent.execute without a channelId.
pub const DEFAULT_CHANNEL: &str = "api";
/// User label of sessions whose key names no userId.
pub const DEFAULT_USER: &str = "main";

/// Who a session belongs to, and its canonical key.
///
/// Built only through this module's constructors (a private field seals it), so the owner is
/// always derived from a principal, never from a label a caller chose:
/// [`SessionIdent::for_caller`] for API callers (it can never yield an internal owner),
/// [`SessionIdent::internal`] for the gateway's own heartbeat, webhook and cron code, and
/// [`SessionIdent::stored`] for an identity that was already authorized and recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionIdent {
    pub key: String,
    pub agent_id: String,
    pub channel: String,
    /// The owner of the session: the calling principal (or the tenant an admin named), or for
    /// the gateway's own channels the owner [`InternalChannel::owner`] gives.
    pub tenant_id: String,
    pub user_id: String,
    _sealed: Sealed,
}

/// Only this module can build one (so only its constructors build a [`SessionIdent`]).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Sealed;

use crate::store::sessions::is_internal_principal;
use crate::store::sessions::{session_key, InternalChannel};

/// The parts of a session key as an API caller names them; an absent part takes its default
/// (channel [`DEFAULT_CHANNEL`], the caller's own tenant, user [`DEFAULT_USER`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct CallerKey<'a> {
    pub channel: Option<&'a str>,
    pub tenant: Option<&'a str>,
    pub user: Option<&'a str>,
}

/// Which part of a caller's session key was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyPart {
    Agent,
    Channel,
    Tenant,
    User,
}

/// Why a caller's session key was refused; the call site names the part as its surface spells
/// it (-32602 / 400).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRefused {
    pub part: KeyPart,
    pub why: String,
}

impl KeyRefused {
    /// Invalid params naming the part through `name` (e.g. `sessionKey.channelId`).
    pub fn named(self, name: impl Fn(KeyPart) -> &'static str) -> GatewayError {
        GatewayError::InvalidParams(format!("'{}': {}", name(self.part), self.why))
    }

    /// Invalid params naming the one field all parts come from (e.g. `session_key`).
    pub fn at(self, field: &str) -> GatewayError {
        GatewayError::InvalidParams(format!("'{field}': {}", self.why))
    }
}

/// Refuses control characters (C0, DEL, C1: CR/LF would split log lines and keys) in a part.
fn printable(part: KeyPart, value: &str) -> Result<(), KeyRefused> {
    match value.chars().find(|c| c.is_control()) {
        Some(c) => Err(KeyRefused {
            part,
            why: format!(
                "must not contain control characters (found U+{:04X})",
                c as u32
            ),
        }),
        None => Ok(()),
    }
}

impl SessionIdent {
    /// The session an API caller names. Its owner is the caller's client id, or the tenant it
    /// names when its tenant reaches that one (the catalogue's `tenant` rule has refused
    /// another tenant's name to a caller without admin before the handler ran). Never an
    /// internal owner: a channel label of the gateway's own ([`InternalChannel`]) is refused,
    /// and so is a named tenant that is an internal principal; control characters are
    /// refused in every part.
    pub fn for_caller(
        caller: &Identity,
        agent_id: &str,
        parts: CallerKey<'_>,
    ) -> Result<Self, KeyRefused> {
        let channel = parts.channel.unwrap_or(DEFAULT_CHANNEL);
        let user = parts.user.unwrap_or(DEFAULT_USER);
        printable(KeyPart::Agent, agent_id)?;
        printable(KeyPart::Channel, channel)?;
        printable(KeyPart::User, user)?;
        if let Some(c) = InternalChannel::of(channel) {
            return Err(KeyRefused {
                part: KeyPart::Channel,
                why: format!(
                    "'{}' is a channel of the gateway's own sessions (heartbeat, webhook, cron); \
                     choose another label",
                    c.label()
                ),
            });
        }
        let owner = match parts.tenant {
            Some(named) if named != caller.client_id => {
                printable(KeyPart::Tenant, named)?;
                if is_internal_principal(named) {
                    return Err(KeyRefused {
                        part: KeyPart::Tenant,
                        why: format!(
                            "'{named}' is not a tenant (':' marks the gateway's own principals)"
                        ),
                    });
                }
                if !caller.tenant().reaches(Some(named)) {
                    return Err(KeyRefused {
                        part: KeyPart::Tenant,
                        why: "only admin tokens name another tenant".to_owned(),
                    });
                }
                named
            }
            _ => caller.client_id.as_str(),
        };
        Ok(Self::build(
            agent_id,
            channel,
            owner,
            user,
            owner.to_owned(),
        ))
    }

    /// The session a caller names by a whole canonical key
    /// (`agent:<agent>:<channel>:<tenant>:<user>`) that is not stored yet, to create it for
    /// `agent_id`: the same rules as [`SessionIdent::for_caller`] with the key's parts, and the
    /// key must name that agent (else the session created would not be the one named). None
    /// for a key of any other form.
    pub fn for_caller_key(
        caller: &Identity,
        agent_id: &str,
        key: &str,
    ) -> Result<Option<Self>, KeyRefused> {
        let Some([agent, channel, tenant, user]) = crate::store::sessions::key_parts(key) else {
            return Ok(None);
        };
        if agent != agent_id {
            return Err(KeyRefused {
                part: KeyPart::Agent,
                why: format!("names agent '{agent}', not '{agent_id}'"),
            });
        }
        let parts = CallerKey {
            channel: Some(&channel),
            tenant: Some(&tenant),
            user: Some(&user),
        };
        Self::for_caller(caller, agent_id, parts).map(Some)
    }

    /// A stored session an API caller continues (the catalogue's rule has checked that the
    /// caller reaches it), run by `agent_id`. The gateway's own conversations (heartbeat,
    /// webhook, cron) are continued by the gateway only, whoever reaches them for reading.
    pub fn for_caller_stored(row: &SessionRow, agent_id: &str) -> Result<Self, KeyRefused> {
        if let Some(c) = InternalChannel::of(&row.channel) {
            return Err(KeyRefused {
                part: KeyPart::Channel,
                why: format!(
                    "{} is a {} session of the gateway's own; only the gateway continues it",
                    row.key,
                    c.label()
                ),
            });
        }
        Ok(Self::stored(
            row.key.clone(),
            agent_id.to_owned(),
            row.channel.clone(),
            row.tenant_id.clone().unwrap_or_default(),
            row.user_id.clone().unwrap_or_default(),
        ))
    }

    /// A session of one of the gateway's own channels: for the heartbeat, webhook and cron
    /// code only (never with caller input as the channel). `tenant` is the key's tenant part
    /// (`system`, the mapping id, the job's owner); the owner follows from the channel.
    pub fn internal(channel: InternalChannel, agent_id: &str, tenant: &str, user: &str) -> Self {
        Self::build(
            agent_id,
            channel.label(),
            tenant,
            user,
            channel.owner(tenant),
        )
    }

    /// The identity of a session that was already authorized and recorded: a stored session
    /// row, or the record a queued run kept when it was accepted. Never from caller input.
    pub fn stored(
        key: String,
        agent_id: String,
        channel: String,
        owner: String,
        user_id: String,
    ) -> Self {
        Self {
            key,
            agent_id,
            channel,
            tenant_id: owner,
            user_id,
            _sealed: Sealed,
        }
    }

    fn build(agent_id: &str, channel: &str, tenant: &str, user: &str, owner: String) -> Self {
        Self {
            key: session_key(agent_id, channel, tenant, user),
            agent_id: agent_id.to_owned(),
            channel: channel.to_owned(),
            tenant_id: owner,
            user_id: user.to_owned(),
            _sealed: Sealed,
        }
    }

    /// The owner a canonical key names, as [`SessionIdent::internal`] and
    /// [`SessionIdent::for_caller`] derive it (for the unit tests of both against the store's
    /// namespace rules).
    #[cfg(test)]
    fn key_owner(&self) -> Option<String> {
        crate::store::sessions::key_tenant(&self.key)
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
        created_at: crate::clock::now_ms(),
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
        let a = session_key("a", "api", "t:1", "u");
        let b = session_key("a", "api", "t", "1:u");
        assert_ne!(a, b);
        assert_eq!(a, "agent:a:api:t%3A1:u");
        // An escaped colon in a part stays distinct from a colon.
        let c = session_key("a%3A", "api", "", "ü:");
        assert_eq!(c, "agent:a%253A:api::ü%3A");
        assert_ne!(c, session_key("a:", "api", "", "ü:"));
    }

    fn caller(id: &str, admin: bool) -> crate::api::principal::Principal {
        use crate::api::generated::methods::Scope;
        let scopes = if admin {
            crate::api::scopes::Scopes::all()
        } else {
            crate::api::scopes::Scopes::only(Scope::Rpc)
        };
        crate::api::principal::Principal::new(id, scopes)
    }

    fn parts<'a>(
        channel: Option<&'a str>,
        tenant: Option<&'a str>,
        user: Option<&'a str>,
    ) -> CallerKey<'a> {
        CallerKey {
            channel,
            tenant,
            user,
        }
    }

    #[test]
    fn a_caller_owns_its_sessions_and_never_reaches_an_internal_one() {
        let system = caller("system", false);
        let s = SessionIdent::for_caller(&system, "bot", CallerKey::default()).unwrap();
        assert_eq!(s.key, "agent:bot:api:system:main");
        assert_eq!(s.tenant_id, "system");
        assert_eq!(s.key_owner().as_deref(), Some("system"));
        // Every internal channel label is refused, whoever asks and whatever else is named.
        for who in [caller("system", false), caller("root", true)] {
            for c in InternalChannel::ALL {
                for tenant in [None, Some("system"), Some("echo")] {
                    let r = SessionIdent::for_caller(
                        &who,
                        "bot",
                        parts(Some(c.label()), tenant, Some("main")),
                    )
                    .unwrap_err();
                    assert_eq!(r.part, KeyPart::Channel);
                }
            }
        }
        // An admin names another tenant, never an internal principal.
        let root = caller("root", true);
        let s = SessionIdent::for_caller(&root, "bot", parts(None, Some("alice"), None)).unwrap();
        assert_eq!(
            (s.tenant_id.as_str(), s.key.as_str()),
            ("alice", "agent:bot:api:alice:main")
        );
        for internal in ["heartbeat:system", "webhook:echo", "cron:config"] {
            let r = SessionIdent::for_caller(&root, "bot", parts(None, Some(internal), None))
                .unwrap_err();
            assert_eq!(r.part, KeyPart::Tenant);
        }
        // A caller without admin cannot name another tenant (the rule refused it before).
        let r =
            SessionIdent::for_caller(&system, "bot", parts(None, Some("alice"), None)).unwrap_err();
        assert_eq!(r.part, KeyPart::Tenant);
        // Naming one's own tenant is the same session as naming none.
        let own = SessionIdent::for_caller(&system, "bot", parts(None, Some("system"), None));
        assert_eq!(own.unwrap().key, "agent:bot:api:system:main");
        // Control characters, in every part.
        for (p, bad) in [
            (KeyPart::Channel, parts(Some("a\nb"), None, None)),
            (KeyPart::User, parts(None, None, Some("u\r"))),
            (KeyPart::User, parts(None, None, Some("u\u{7f}"))),
            (KeyPart::User, parts(None, None, Some("u\u{85}"))),
            (KeyPart::Tenant, parts(None, Some("t\u{0}"), None)),
        ] {
            assert_eq!(
                SessionIdent::for_caller(&root, "bot", bad)
                    .unwrap_err()
                    .part,
                p
            );
        }
        let r = SessionIdent::for_caller(&root, "b\tot", CallerKey::default()).unwrap_err();
        assert_eq!(r.part, KeyPart::Agent);
        // The internal principals' own work may own internal sessions (their own id).
        let hook = caller("webhook:echo", false);
        let s = SessionIdent::for_caller(&hook, "bot", CallerKey::default()).unwrap();
        assert_eq!(s.tenant_id, "webhook:echo");
    }

    #[test]
    fn internal_sessions_have_internal_owners() {
        let hb = SessionIdent::internal(InternalChannel::Heartbeat, "bot", "system", "main");
        assert_eq!(hb.key, "agent:bot:heartbeat:system:main");
        assert_eq!(hb.tenant_id, "heartbeat:system");
        let wh = SessionIdent::internal(InternalChannel::Webhook, "bot", "echo", "d1");
        assert_eq!(wh.tenant_id, "webhook:echo");
        let cron = SessionIdent::internal(InternalChannel::Cron, "bot", "alice", "job1");
        assert_eq!(cron.tenant_id, "alice");
        for s in [hb, wh, cron] {
            assert_eq!(
                s.key_owner().as_deref(),
                Some(s.tenant_id.as_str()),
                "{}",
                s.key
            );
        }
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
