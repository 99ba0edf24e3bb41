//! Full-text search over transcripts and agent memory (SQLite FTS5: the one backend-specific
//! part of the store; a PostgreSQL backend would use tsvector here).

use sqlx::Row;

use super::Store;
use crate::error::GatewayError;
use crate::tenancy::Tenant;

/// One transcript match.
#[derive(Debug, Clone, PartialEq)]
pub struct MessageHit {
    pub session_key: String,
    pub agent_id: String,
    pub channel: String,
    pub snippet: String,
    pub score: f64,
    pub timestamp: i64,
}

/// One memory match.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryHit {
    pub id: i64,
    pub agent_id: String,
    pub content: String,
    pub tags: String,
    pub session_key: Option<String>,
    pub score: f64,
    pub created_at: i64,
}

/// Turns free text into an FTS5 query: every word quoted (so no user text is FTS syntax),
/// alternatives joined with OR and ranked by bm25. None when the text has no word.
pub fn fts_query(text: &str) -> Option<String> {
    let terms: Vec<String> = text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|t| !t.is_empty())
        .take(32)
        .map(|t| format!("\"{t}\""))
        .collect();
    (!terms.is_empty()).then(|| terms.join(" OR "))
}

/// At most `max` characters.
fn clip(s: String, max: usize) -> String {
    if s.chars().count() <= max {
        s
    } else {
        s.chars().take(max).collect()
    }
}

impl Store {
    /// Transcript search over the sessions `tenant` reaches, best first.
    pub async fn search_messages(
        &self,
        tenant: &Tenant,
        text: &str,
        limit: i64,
    ) -> Result<Vec<MessageHit>, GatewayError> {
        let Some(q) = fts_query(text) else {
            return Ok(Vec::new());
        };
        let rows = sqlx::query(
            "SELECT s.session_key, s.agent_id, s.channel, m.created_at, \
             snippet(messages_fts, 0, '', '', '...', 24) AS snip, bm25(messages_fts) AS rank \
             FROM messages_fts JOIN messages m ON m.id = messages_fts.rowid \
             JOIN sessions s ON s.session_key = m.session_key \
             WHERE messages_fts MATCH ?1 AND (?2 IS NULL OR s.tenant_id = ?2) \
             ORDER BY rank LIMIT ?3",
        )
        .bind(&q)
        .bind(tenant.only())
        .bind(limit)
        .fetch_all(self.pool())
        .await?;
        let mut hits = Vec::with_capacity(rows.len());
        for r in rows {
            let rank: f64 = r.try_get("rank")?;
            hits.push(MessageHit {
                session_key: r.try_get("session_key")?,
                agent_id: r.try_get("agent_id")?,
                channel: r.try_get("channel")?,
                snippet: clip(r.try_get("snip")?, 1000),
                score: (-rank).max(0.0),
                timestamp: r.try_get("created_at")?,
            });
        }
        Ok(hits)
    }

    /// Memory search over the memories `tenant` reaches, within one agent's (or every
    /// agent's), best first.
    pub async fn search_memories(
        &self,
        tenant: &Tenant,
        agent_id: Option<&str>,
        text: &str,
        limit: i64,
    ) -> Result<Vec<MemoryHit>, GatewayError> {
        let Some(q) = fts_query(text) else {
            return Ok(Vec::new());
        };
        let rows = sqlx::query(
            "SELECT m.id, m.agent_id, m.content, m.tags, m.session_key, m.created_at, bm25(memories_fts) AS rank \
             FROM memories_fts JOIN memories m ON m.id = memories_fts.rowid \
             WHERE memories_fts MATCH ?1 AND (?2 IS NULL OR m.agent_id = ?2) \
             AND (?3 IS NULL OR m.tenant_id = ?3) ORDER BY rank LIMIT ?4",
        )
        .bind(&q)
        .bind(agent_id)
        .bind(tenant.only())
        .bind(limit)
        .fetch_all(self.pool())
        .await?;
        let mut hits = Vec::with_capacity(rows.len());
        for r in rows {
            let rank: f64 = r.try_get("rank")?;
            hits.push(MemoryHit {
                id: r.try_get("id")?,
                agent_id: r.try_get("agent_id")?,
                content: r.try_get("content")?,
                tags: r.try_get("tags")?,
                session_key: r.try_get("session_key")?,
                score: (-rank).max(0.0),
                created_at: r.try_get("created_at")?,
            });
        }
        Ok(hits)
    }

    /// Counts for the memory dashboard over what `tenant` reaches: memories, notes, indexed
    /// transcript messages.
    pub async fn memory_stats(&self, tenant: &Tenant) -> Result<(i64, i64, i64), GatewayError> {
        let row = sqlx::query(
            "SELECT (SELECT COUNT(*) FROM memories WHERE ?1 IS NULL OR tenant_id = ?1) AS memories, \
                    (SELECT COUNT(*) FROM session_notes n JOIN sessions s ON s.session_key = n.session_key \
                     WHERE ?1 IS NULL OR s.tenant_id = ?1) AS notes, \
                    (SELECT COUNT(*) FROM messages m JOIN sessions s ON s.session_key = m.session_key \
                     WHERE ?1 IS NULL OR s.tenant_id = ?1) AS messages",
        )
        .bind(tenant.only())
        .fetch_one(self.pool())
        .await?;
        Ok((
            row.try_get("memories")?,
            row.try_get("notes")?,
            row.try_get("messages")?,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::fts_query;

    #[test]
    fn user_text_never_becomes_fts_syntax() {
        assert_eq!(
            fts_query("weather OR \"x\" NEAR(a b)").as_deref(),
            Some("\"weather\" OR \"OR\" OR \"x\" OR \"NEAR\" OR \"a\" OR \"b\"")
        );
        assert_eq!(fts_query("*** ---"), None);
    }
}
