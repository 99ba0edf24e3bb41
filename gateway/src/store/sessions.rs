//! The `sessions` and `messages` tables: conversations and their transcripts.

use super::{now_ms, on_pool, text, Store, StoreRow};
use crate::api::error::GatewayError;
use crate::api::tenancy::Tenant;

/// A stored session with its counters.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionRow {
    pub key: String,
    pub agent_id: String,
    pub channel: String,
    pub tenant_id: Option<String>,
    pub user_id: Option<String>,
    pub label: Option<String>,
    /// JSON object text.
    pub metadata: String,
    pub message_count: i64,
    pub input_tokens: i64,
    pub output_tokens: i64,
    pub cost_usd: f64,
    pub last_steps: i64,
    pub last_model: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
}

/// What identifies a session when it is first written.
#[derive(Debug, Clone)]
pub struct NewSession<'a> {
    pub key: &'a str,
    pub agent_id: &'a str,
    pub channel: &'a str,
    pub tenant_id: Option<&'a str>,
    pub user_id: Option<&'a str>,
}

/// One stored message.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MessageRow {
    pub seq: i64,
    pub role: String,
    pub content: String,
    /// JSON array text.
    pub tool_calls: Option<String>,
    pub tool_call_id: Option<String>,
    pub tool_name: Option<String>,
    pub is_error: Option<bool>,
    pub model: Option<String>,
    pub input_tokens: Option<i64>,
    pub output_tokens: Option<i64>,
    pub created_at: i64,
}

/// Counters a turn adds to its session.
#[derive(Debug, Clone, Default)]
pub struct TurnTotals {
    pub input_tokens: i64,
    pub output_tokens: i64,
    pub cost_usd: f64,
    pub steps: i64,
    pub model: Option<String>,
    /// How the turn ended (counted as a turn when set).
    pub finish_reason: Option<&'static str>,
    /// With finish reason error: the model call's error kind.
    pub error_kind: Option<&'static str>,
}

/// Filters of session.list.
#[derive(Debug, Clone)]
pub struct SessionFilter {
    pub agent_id: Option<String>,
    pub channel: Option<String>,
    pub updated_since: Option<i64>,
    /// Whose sessions are listed (the caller's reach).
    pub tenant: Tenant,
}

impl SessionFilter {
    /// Every session `tenant` reaches, unfiltered otherwise.
    pub fn of(tenant: Tenant) -> Self {
        Self {
            agent_id: None,
            channel: None,
            updated_since: None,
            tenant,
        }
    }
}

/// The condition every tenant-scoped query of sessions uses: the session `s` is within the
/// reach of the tenant bound as parameter `$n` (NULL: every tenant).
fn reached(n: u8) -> String {
    format!("(${n} IS NULL OR s.tenant_id = ${n})")
}

/// A channel whose sessions only the gateway itself creates and continues (heartbeat ticks,
/// webhook runs, cron fires). API callers never name one: `runtime::sessions::SessionIdent`
/// builds a caller's session through a constructor that refuses these labels, and a canonical
/// key naming one is in the gateway's namespace, never claimable by a token
/// ([`key_namespace`]). A later internal channel is one more variant here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InternalChannel {
    Heartbeat,
    Webhook,
    Cron,
}

impl InternalChannel {
    /// Every internal channel.
    pub const ALL: [InternalChannel; 3] = [Self::Heartbeat, Self::Webhook, Self::Cron];

    /// The channel label, as it appears in session keys.
    pub const fn label(self) -> &'static str {
        match self {
            Self::Heartbeat => "heartbeat",
            Self::Webhook => "webhook",
            Self::Cron => "cron",
        }
    }

    /// The internal channel a label names, if any.
    pub fn of(label: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.label() == label)
    }

    /// The owner of a session of this channel whose key's tenant part is `tenant`: the
    /// gateway's own principal `<channel>:<tenant>` for heartbeats (`heartbeat:system`) and
    /// webhooks (`webhook:<mapping>`); for cron the job's owner (the client id that created
    /// the job, who reads its turns, or `cron:config` for the operator's jobs).
    pub fn owner(self, tenant: &str) -> String {
        match self {
            Self::Heartbeat | Self::Webhook => format!("{}:{tenant}", self.label()),
            Self::Cron => tenant.to_owned(),
        }
    }
}

/// Whether `id` names one of the gateway's own principals (`heartbeat:system`,
/// `webhook:<mapping>`, `cron:config`). They all contain ':', which no token id may contain
/// (`gateway.tokens[].id` is refused at start, the `tokens.create` id pattern refuses it), so a
/// token's client id never equals an internal owner.
pub fn is_internal_principal(id: &str) -> bool {
    id.contains(':')
}

/// The owner of a session created under `channel` for the key's tenant part `tenant`.
pub fn owner_of(channel: &str, tenant: &str) -> String {
    match InternalChannel::of(channel) {
        Some(c) => c.owner(tenant),
        None => tenant.to_owned(),
    }
}

const SESSION_COLUMNS: &str = "s.session_key, s.agent_id, s.channel, s.tenant_id, s.user_id, s.label, s.metadata, \
     (SELECT COUNT(*) FROM messages m WHERE m.session_key = s.session_key) AS message_count, \
     s.input_tokens, s.output_tokens, s.cost_usd, s.last_steps, s.last_model, s.created_at, s.updated_at";

pub(super) const MESSAGE_COLUMNS: &str = "seq, role, content, tool_calls, tool_call_id, tool_name, is_error, model, input_tokens, output_tokens, created_at";

fn session_row(r: &impl StoreRow) -> Result<SessionRow, sqlx::Error> {
    Ok(SessionRow {
        key: r.col("session_key")?,
        agent_id: r.col("agent_id")?,
        channel: r.col("channel")?,
        tenant_id: r.col("tenant_id")?,
        user_id: r.col("user_id")?,
        label: r.col("label")?,
        metadata: r.col("metadata")?,
        message_count: r.col("message_count")?,
        input_tokens: r.col("input_tokens")?,
        output_tokens: r.col("output_tokens")?,
        cost_usd: r.col("cost_usd")?,
        last_steps: r.col("last_steps")?,
        last_model: r.col("last_model")?,
        created_at: r.col("created_at")?,
        updated_at: r.col("updated_at")?,
    })
}

pub(super) fn message_row(r: &impl StoreRow) -> Result<MessageRow, sqlx::Error> {
    Ok(MessageRow {
        seq: r.col("seq")?,
        role: r.col("role")?,
        content: r.col("content")?,
        tool_calls: r.col("tool_calls")?,
        tool_call_id: r.col("tool_call_id")?,
        tool_name: r.col("tool_name")?,
        is_error: r.col::<Option<i64>>("is_error")?.map(|v| v != 0),
        model: r.col("model")?,
        input_tokens: r.col("input_tokens")?,
        output_tokens: r.col("output_tokens")?,
        created_at: r.col("created_at")?,
    })
}

/// Inserts `$messages` into session `$key` from seq `$first` on, within the transaction `$tx`
/// (a macro: the body is the same for both backends' connection types).
macro_rules! insert_messages {
    ($tx:expr, $key:expr, $first:expr, $messages:expr) => {
        for (i, m) in $messages.iter().enumerate() {
            sqlx::query(
                "INSERT INTO messages (session_key, seq, role, content, tool_calls, tool_call_id, tool_name, is_error, model, input_tokens, output_tokens, created_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
            )
            .bind($key)
            .bind($first + i as i64)
            .bind(&m.role)
            .bind(text(&m.content))
            .bind(&m.tool_calls)
            .bind(&m.tool_call_id)
            .bind(&m.tool_name)
            .bind(m.is_error.map(i64::from))
            .bind(&m.model)
            .bind(m.input_tokens)
            .bind(m.output_tokens)
            .bind(if m.created_at > 0 { m.created_at } else { now_ms() })
            .execute(&mut *$tx)
            .await?;
        }
    };
}

/// Appends `part` with `%` and `:` escaped.
fn push_escaped(key: &mut String, part: &str) {
    for c in part.chars() {
        match c {
            '%' => key.push_str("%25"),
            ':' => key.push_str("%3A"),
            c => key.push(c),
        }
    }
}

/// `agent:<agent>:<channel>:<tenant>:<user>`, each part with `%` and `:` escaped, so
/// distinct parts never produce the same key.
pub fn session_key(agent_id: &str, channel: &str, tenant_id: &str, user_id: &str) -> String {
    let parts = [agent_id, channel, tenant_id, user_id];
    let mut key = String::with_capacity(5 + parts.iter().map(|p| p.len() + 1).sum::<usize>());
    key.push_str("agent");
    for part in parts {
        key.push(':');
        push_escaped(&mut key, part);
    }
    key
}

/// The four parts of a key in the canonical form of [`session_key`] (agent, channel, tenant,
/// user), unescaped; None for a key of any other form.
pub fn key_parts(key: &str) -> Option<[String; 4]> {
    let parts: Vec<&str> = key.split(':').collect();
    let ["agent", agent, channel, tenant, user] = parts.as_slice() else {
        return None;
    };
    Some([
        unescape(agent)?,
        unescape(channel)?,
        unescape(tenant)?,
        unescape(user)?,
    ])
}

fn unescape(part: &str) -> Option<String> {
    let mut out = String::with_capacity(part.len());
    let mut rest = part;
    while let Some(i) = rest.find('%') {
        out.push_str(&rest[..i]);
        out.push(match rest.get(i + 1..i + 3)? {
            "25" => '%',
            "3A" => ':',
            _ => return None,
        });
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    Some(out)
}

/// The owner a key in the canonical form of [`session_key`] names (see [`owner_of`]); None for
/// any other form. A stored session of the key has this owner (else it predates ownership
/// rules and is nobody's but admin's).
pub fn key_tenant(key: &str) -> Option<String> {
    let [_, channel, tenant, _] = key_parts(key)?;
    Some(owner_of(&channel, &tenant))
}

/// Whose namespace a canonical key that is not stored yet is in, for the ownership rules'
/// `missing: claim`: its tenant part, or for an internal channel the gateway's own
/// `<channel>:<tenant>` (an internal principal, so no token claims it, its owner included: a
/// cron job's session is created by its fires only). None for any other form.
pub fn key_namespace(key: &str) -> Option<String> {
    let [_, channel, tenant, _] = key_parts(key)?;
    Some(match InternalChannel::of(&channel) {
        Some(c) => format!("{}:{tenant}", c.label()),
        None => tenant,
    })
}

impl Store {
    /// Creates the session when it does not exist yet.
    pub async fn session_ensure(&self, s: &NewSession<'_>) -> Result<(), GatewayError> {
        let now = now_ms();
        on_pool!(self.pool(), |p| {
            sqlx::query(
            "INSERT INTO sessions (session_key, agent_id, channel, tenant_id, user_id, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $6) ON CONFLICT (session_key) DO NOTHING",
        )
        .bind(s.key)
        .bind(s.agent_id)
        .bind(s.channel)
        .bind(s.tenant_id)
        .bind(s.user_id)
        .bind(now)
        .execute(p)
        .await
        .map(drop)
        })?;
        Ok(())
    }

    /// The session `key` when `tenant` reaches it.
    pub async fn session_get(
        &self,
        tenant: &Tenant,
        key: &str,
    ) -> Result<Option<SessionRow>, GatewayError> {
        let sql = format!(
            "SELECT {SESSION_COLUMNS} FROM sessions s WHERE s.session_key = $1 AND {}",
            reached(2)
        );
        Ok(on_pool!(self.pool(), |p| {
            let row = sqlx::query(&sql)
                .bind(key)
                .bind(tenant.only())
                .fetch_optional(p)
                .await?;
            row.as_ref().map(session_row).transpose()?
        }))
    }

    /// A page of sessions, most recently updated first, and the total matching.
    pub async fn session_list(
        &self,
        f: &SessionFilter,
        limit: i64,
        offset: i64,
    ) -> Result<(Vec<SessionRow>, i64), GatewayError> {
        // Numbered parameters: each filter is bound once and used twice.
        let cond = "($1 IS NULL OR s.agent_id = $1) AND ($2 IS NULL OR s.channel = $2) \
                    AND ($3 IS NULL OR s.updated_at >= $3) AND ($4 IS NULL OR s.tenant_id = $4)";
        let count = format!("SELECT COUNT(*) FROM sessions s WHERE {cond}");
        let page = format!(
            "SELECT {SESSION_COLUMNS} FROM sessions s WHERE {cond} \
             ORDER BY s.updated_at DESC, s.session_key LIMIT $5 OFFSET $6"
        );
        Ok(on_pool!(self.pool(), |p| {
            let total: i64 = sqlx::query_scalar(&count)
                .bind(&f.agent_id)
                .bind(&f.channel)
                .bind(f.updated_since)
                .bind(f.tenant.only())
                .fetch_one(p)
                .await?;
            let rows = sqlx::query(&page)
                .bind(&f.agent_id)
                .bind(&f.channel)
                .bind(f.updated_since)
                .bind(f.tenant.only())
                .bind(limit)
                .bind(offset)
                .fetch_all(p)
                .await?;
            let list = rows.iter().map(session_row).collect::<Result<_, _>>()?;
            (list, total)
        }))
    }

    /// The latest `limit` messages with seq below `before` (all when None), oldest first, and
    /// whether older ones exist.
    pub async fn session_messages(
        &self,
        tenant: &Tenant,
        key: &str,
        before: Option<i64>,
        limit: i64,
    ) -> Result<(Vec<MessageRow>, bool), GatewayError> {
        let sql = format!(
            "SELECT {MESSAGE_COLUMNS} FROM messages WHERE session_key = $1 AND ($2 IS NULL OR seq < $2) \
             AND EXISTS (SELECT 1 FROM sessions s WHERE s.session_key = $1 AND {}) \
             ORDER BY seq DESC LIMIT $4",
            reached(3)
        );
        let mut list: Vec<MessageRow> = on_pool!(self.pool(), |p| {
            let rows = sqlx::query(&sql)
                .bind(key)
                .bind(before)
                .bind(tenant.only())
                .bind(limit + 1)
                .fetch_all(p)
                .await?;
            rows.iter().map(message_row).collect::<Result<_, _>>()?
        });
        let has_more = list.len() as i64 > limit;
        list.truncate(limit.max(0) as usize);
        list.reverse();
        Ok((list, has_more))
    }

    /// Every message, oldest first (none when `tenant` does not reach the session).
    pub async fn session_all_messages(
        &self,
        tenant: &Tenant,
        key: &str,
    ) -> Result<Vec<MessageRow>, GatewayError> {
        let sql = format!(
            "SELECT {MESSAGE_COLUMNS} FROM messages WHERE session_key = $1 \
             AND EXISTS (SELECT 1 FROM sessions s WHERE s.session_key = $1 AND {}) ORDER BY seq",
            reached(2)
        );
        Ok(on_pool!(self.pool(), |p| {
            let rows = sqlx::query(&sql)
                .bind(key)
                .bind(tenant.only())
                .fetch_all(p)
                .await?;
            rows.iter().map(message_row).collect::<Result<_, _>>()?
        }))
    }

    /// Appends messages and adds a turn's counters, in one transaction. The session row is
    /// updated first: that takes its lock, so appends through several nodes at once each get
    /// their own range of seq numbers.
    pub async fn session_append(
        &self,
        key: &str,
        messages: &[MessageRow],
        totals: &TurnTotals,
    ) -> Result<i64, GatewayError> {
        let n = messages.len() as i64;
        Ok(on_pool!(self.pool(), |p| {
            let mut tx = p.begin().await?;
            let first: i64 = sqlx::query_scalar(
                "UPDATE sessions SET next_seq = next_seq + $1, input_tokens = input_tokens + $2, \
                 output_tokens = output_tokens + $3, cost_usd = cost_usd + $4, last_steps = $5, \
                 last_model = COALESCE($6, last_model), updated_at = $7, \
                 turns = turns + $9, last_finish_reason = COALESCE($10, last_finish_reason), \
                 last_error_kind = CASE WHEN $10 IS NULL THEN last_error_kind ELSE $11 END \
                 WHERE session_key = $8 RETURNING next_seq - $1",
            )
            .bind(n)
            .bind(totals.input_tokens)
            .bind(totals.output_tokens)
            .bind(totals.cost_usd)
            .bind(totals.steps)
            .bind(&totals.model)
            .bind(now_ms())
            .bind(key)
            .bind(i64::from(totals.finish_reason.is_some()))
            .bind(totals.finish_reason)
            .bind(totals.error_kind)
            .fetch_one(&mut *tx)
            .await?;
            insert_messages!(tx, key, first, messages);
            tx.commit().await?;
            first
        }))
    }

    /// Replaces the whole transcript, renumbering from 0 (and dropping its summary tree).
    pub async fn session_replace_messages(
        &self,
        key: &str,
        messages: &[MessageRow],
    ) -> Result<(), GatewayError> {
        on_pool!(self.pool(), |p| {
            let mut tx = p.begin().await?;
            sqlx::query(
                "UPDATE sessions SET next_seq = $1, updated_at = $2 WHERE session_key = $3",
            )
            .bind(messages.len() as i64)
            .bind(now_ms())
            .bind(key)
            .execute(&mut *tx)
            .await?;
            sqlx::query("DELETE FROM messages WHERE session_key = $1")
                .bind(key)
                .execute(&mut *tx)
                .await?;
            // Seq numbers start again at 0: summaries of the old numbers would cover new rows.
            sqlx::query("DELETE FROM context_summaries WHERE session_key = $1")
                .bind(key)
                .execute(&mut *tx)
                .await?;
            insert_messages!(tx, key, 0i64, messages);
            tx.commit().await?;
        });
        Ok(())
    }

    /// Clears the messages and their summary tree (keeping the session and its metadata); the
    /// count of messages cleared, or None when the session does not exist.
    pub async fn session_clear(
        &self,
        tenant: &Tenant,
        key: &str,
    ) -> Result<Option<i64>, GatewayError> {
        let reset = format!(
            "UPDATE sessions AS s SET next_seq = 0, last_steps = 0, updated_at = $3 \
             WHERE s.session_key = $1 AND {}",
            reached(2)
        );
        Ok(on_pool!(self.pool(), |p| {
            let mut tx = p.begin().await?;
            let found = sqlx::query(&reset)
                .bind(key)
                .bind(tenant.only())
                .bind(now_ms())
                .execute(&mut *tx)
                .await?
                .rows_affected();
            if found == 0 {
                return Ok(None);
            }
            let done = sqlx::query("DELETE FROM messages WHERE session_key = $1")
                .bind(key)
                .execute(&mut *tx)
                .await?;
            // Seq numbers start again at 0: summaries of the old numbers would cover new rows.
            sqlx::query("DELETE FROM context_summaries WHERE session_key = $1")
                .bind(key)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            Some(done.rows_affected() as i64)
        }))
    }

    /// Deletes a session with its messages and notes; false when unknown (or out of reach).
    pub async fn session_delete(&self, tenant: &Tenant, key: &str) -> Result<bool, GatewayError> {
        let sql = format!(
            "DELETE FROM sessions AS s WHERE s.session_key = $1 AND {}",
            reached(2)
        );
        let done = on_pool!(self.pool(), |p| sqlx::query(&sql)
            .bind(key)
            .bind(tenant.only())
            .execute(p)
            .await
            .map(|d| d.rows_affected()))?;
        Ok(done == 1)
    }
}
