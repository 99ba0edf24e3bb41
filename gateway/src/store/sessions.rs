//! The `sessions` and `messages` tables: conversations and their transcripts.

use sqlx::sqlite::SqliteRow;
use sqlx::Row;

use super::{now_ms, Store};
use crate::error::GatewayError;
use crate::tenancy::Tenant;

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
/// reach of the tenant bound as parameter `?n` (NULL: every tenant).
fn reached(n: u8) -> String {
    format!("(?{n} IS NULL OR s.tenant_id = ?{n})")
}

/// Channels whose sessions belong to the gateway's own principals, never to a token: their
/// owner is `<channel>:<tenant part>`, and token ids cannot contain ':' (config validation).
pub const INTERNAL_CHANNELS: &[&str] = &["webhook", "heartbeat"];

/// The owner of a session created under `channel` for the key's tenant part `tenant`.
pub fn owner_of(channel: &str, tenant: &str) -> String {
    if INTERNAL_CHANNELS.contains(&channel) {
        format!("{channel}:{tenant}")
    } else {
        tenant.to_owned()
    }
}

const SESSION_COLUMNS: &str = "s.session_key, s.agent_id, s.channel, s.tenant_id, s.user_id, s.label, s.metadata, \
     (SELECT COUNT(*) FROM messages m WHERE m.session_key = s.session_key) AS message_count, \
     s.input_tokens, s.output_tokens, s.cost_usd, s.last_steps, s.last_model, s.created_at, s.updated_at";

const MESSAGE_COLUMNS: &str = "seq, role, content, tool_calls, tool_call_id, tool_name, is_error, model, input_tokens, output_tokens, created_at";

fn session_row(r: &SqliteRow) -> Result<SessionRow, sqlx::Error> {
    Ok(SessionRow {
        key: r.try_get("session_key")?,
        agent_id: r.try_get("agent_id")?,
        channel: r.try_get("channel")?,
        tenant_id: r.try_get("tenant_id")?,
        user_id: r.try_get("user_id")?,
        label: r.try_get("label")?,
        metadata: r.try_get("metadata")?,
        message_count: r.try_get("message_count")?,
        input_tokens: r.try_get("input_tokens")?,
        output_tokens: r.try_get("output_tokens")?,
        cost_usd: r.try_get("cost_usd")?,
        last_steps: r.try_get("last_steps")?,
        last_model: r.try_get("last_model")?,
        created_at: r.try_get("created_at")?,
        updated_at: r.try_get("updated_at")?,
    })
}

fn message_row(r: &SqliteRow) -> Result<MessageRow, sqlx::Error> {
    Ok(MessageRow {
        seq: r.try_get("seq")?,
        role: r.try_get("role")?,
        content: r.try_get("content")?,
        tool_calls: r.try_get("tool_calls")?,
        tool_call_id: r.try_get("tool_call_id")?,
        tool_name: r.try_get("tool_name")?,
        is_error: r.try_get::<Option<i64>, _>("is_error")?.map(|v| v != 0),
        model: r.try_get("model")?,
        input_tokens: r.try_get("input_tokens")?,
        output_tokens: r.try_get("output_tokens")?,
        created_at: r.try_get("created_at")?,
    })
}

async fn insert_messages(
    tx: &mut sqlx::SqliteConnection,
    key: &str,
    first_seq: i64,
    messages: &[MessageRow],
) -> Result<(), sqlx::Error> {
    for (i, m) in messages.iter().enumerate() {
        sqlx::query(
            "INSERT INTO messages (session_key, seq, role, content, tool_calls, tool_call_id, tool_name, is_error, model, input_tokens, output_tokens, created_at) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(key)
        .bind(first_seq + i as i64)
        .bind(&m.role)
        .bind(&m.content)
        .bind(&m.tool_calls)
        .bind(&m.tool_call_id)
        .bind(&m.tool_name)
        .bind(m.is_error.map(i64::from))
        .bind(&m.model)
        .bind(m.input_tokens)
        .bind(m.output_tokens)
        .bind(if m.created_at > 0 { m.created_at } else { now_ms() })
        .execute(&mut *tx)
        .await?;
    }
    Ok(())
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
/// any other form.
pub fn key_tenant(key: &str) -> Option<String> {
    let [_, channel, tenant, _] = key_parts(key)?;
    Some(owner_of(&channel, &tenant))
}

impl Store {
    /// Creates the session when it does not exist yet.
    pub async fn session_ensure(&self, s: &NewSession<'_>) -> Result<(), GatewayError> {
        let now = now_ms();
        sqlx::query(
            "INSERT INTO sessions (session_key, agent_id, channel, tenant_id, user_id, created_at, updated_at) \
             VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (session_key) DO NOTHING",
        )
        .bind(s.key)
        .bind(s.agent_id)
        .bind(s.channel)
        .bind(s.tenant_id)
        .bind(s.user_id)
        .bind(now)
        .bind(now)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// The session `key` when `tenant` reaches it.
    pub async fn session_get(
        &self,
        tenant: &Tenant,
        key: &str,
    ) -> Result<Option<SessionRow>, GatewayError> {
        let sql = format!(
            "SELECT {SESSION_COLUMNS} FROM sessions s WHERE s.session_key = ?1 AND {}",
            reached(2)
        );
        let row = sqlx::query(&sql)
            .bind(key)
            .bind(tenant.only())
            .fetch_optional(self.pool())
            .await?;
        Ok(row.as_ref().map(session_row).transpose()?)
    }

    /// A page of sessions, most recently updated first, and the total matching.
    pub async fn session_list(
        &self,
        f: &SessionFilter,
        limit: i64,
        offset: i64,
    ) -> Result<(Vec<SessionRow>, i64), GatewayError> {
        // Numbered parameters: each filter is bound once and used twice.
        let cond = "(?1 IS NULL OR s.agent_id = ?1) AND (?2 IS NULL OR s.channel = ?2) \
                    AND (?3 IS NULL OR s.updated_at >= ?3) AND (?4 IS NULL OR s.tenant_id = ?4)";
        let total: i64 =
            sqlx::query_scalar(&format!("SELECT COUNT(*) FROM sessions s WHERE {cond}"))
                .bind(&f.agent_id)
                .bind(&f.channel)
                .bind(f.updated_since)
                .bind(f.tenant.only())
                .fetch_one(self.pool())
                .await?;
        let sql = format!(
            "SELECT {SESSION_COLUMNS} FROM sessions s WHERE {cond} \
             ORDER BY s.updated_at DESC, s.session_key LIMIT ?5 OFFSET ?6"
        );
        let rows = sqlx::query(&sql)
            .bind(&f.agent_id)
            .bind(&f.channel)
            .bind(f.updated_since)
            .bind(f.tenant.only())
            .bind(limit)
            .bind(offset)
            .fetch_all(self.pool())
            .await?;
        let list = rows.iter().map(session_row).collect::<Result<_, _>>()?;
        Ok((list, total))
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
            "SELECT {MESSAGE_COLUMNS} FROM messages WHERE session_key = ?1 AND (?2 IS NULL OR seq < ?2) \
             AND EXISTS (SELECT 1 FROM sessions s WHERE s.session_key = ?1 AND {}) \
             ORDER BY seq DESC LIMIT ?4",
            reached(3)
        );
        let rows = sqlx::query(&sql)
            .bind(key)
            .bind(before)
            .bind(tenant.only())
            .bind(limit + 1)
            .fetch_all(self.pool())
            .await?;
        let mut list: Vec<MessageRow> = rows.iter().map(message_row).collect::<Result<_, _>>()?;
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
            "SELECT {MESSAGE_COLUMNS} FROM messages WHERE session_key = ?1 \
             AND EXISTS (SELECT 1 FROM sessions s WHERE s.session_key = ?1 AND {}) ORDER BY seq",
            reached(2)
        );
        let rows = sqlx::query(&sql)
            .bind(key)
            .bind(tenant.only())
            .fetch_all(self.pool())
            .await?;
        Ok(rows.iter().map(message_row).collect::<Result<_, _>>()?)
    }

    /// Appends messages and adds a turn's counters, in one transaction.
    pub async fn session_append(
        &self,
        key: &str,
        messages: &[MessageRow],
        totals: &TurnTotals,
    ) -> Result<(), GatewayError> {
        let mut tx = self.pool().begin_with("BEGIN IMMEDIATE").await?;
        let next: i64 = sqlx::query_scalar("SELECT next_seq FROM sessions WHERE session_key = ?")
            .bind(key)
            .fetch_one(&mut *tx)
            .await?;
        insert_messages(&mut tx, key, next, messages).await?;
        sqlx::query(
            "UPDATE sessions SET next_seq = next_seq + ?, input_tokens = input_tokens + ?, \
             output_tokens = output_tokens + ?, cost_usd = cost_usd + ?, last_steps = ?, \
             last_model = COALESCE(?, last_model), updated_at = ? WHERE session_key = ?",
        )
        .bind(messages.len() as i64)
        .bind(totals.input_tokens)
        .bind(totals.output_tokens)
        .bind(totals.cost_usd)
        .bind(totals.steps)
        .bind(&totals.model)
        .bind(now_ms())
        .bind(key)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Replaces the whole transcript (compaction), renumbering from 0.
    pub async fn session_replace_messages(
        &self,
        key: &str,
        messages: &[MessageRow],
    ) -> Result<(), GatewayError> {
        let mut tx = self.pool().begin_with("BEGIN IMMEDIATE").await?;
        sqlx::query("DELETE FROM messages WHERE session_key = ?")
            .bind(key)
            .execute(&mut *tx)
            .await?;
        insert_messages(&mut tx, key, 0, messages).await?;
        sqlx::query("UPDATE sessions SET next_seq = ?, updated_at = ? WHERE session_key = ?")
            .bind(messages.len() as i64)
            .bind(now_ms())
            .bind(key)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Clears the messages (keeping the session and its metadata); the count cleared, or None
    /// when the session does not exist.
    pub async fn session_clear(
        &self,
        tenant: &Tenant,
        key: &str,
    ) -> Result<Option<i64>, GatewayError> {
        let mut tx = self.pool().begin_with("BEGIN IMMEDIATE").await?;
        let exists = sqlx::query(&format!(
            "SELECT 1 FROM sessions s WHERE s.session_key = ?1 AND {}",
            reached(2)
        ))
        .bind(key)
        .bind(tenant.only())
        .fetch_optional(&mut *tx)
        .await?;
        if exists.is_none() {
            return Ok(None);
        }
        let done = sqlx::query("DELETE FROM messages WHERE session_key = ?")
            .bind(key)
            .execute(&mut *tx)
            .await?;
        sqlx::query("UPDATE sessions SET next_seq = 0, last_steps = 0, updated_at = ? WHERE session_key = ?")
            .bind(now_ms())
            .bind(key)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(Some(done.rows_affected() as i64))
    }

    /// Deletes a session with its messages and notes; false when unknown (or out of reach).
    pub async fn session_delete(&self, tenant: &Tenant, key: &str) -> Result<bool, GatewayError> {
        let done = sqlx::query(&format!(
            "DELETE FROM sessions AS s WHERE s.session_key = ?1 AND {}",
            reached(2)
        ))
        .bind(key)
        .bind(tenant.only())
        .execute(self.pool())
        .await?;
        Ok(done.rows_affected() == 1)
    }
}
