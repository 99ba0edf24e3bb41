//! Full-text search over transcripts and agent memory: the one backend-specific part of the
//! store. SQLite uses FTS5 ranked by bm25; PostgreSQL a generated `tsvector` column with a GIN
//! index (configuration `simple`: lowercased words, no stemming, like FTS5's default tokenizer)
//! ranked by `ts_rank` with length normalisation, which orders results as bm25 does. Scores are
//! comparable within one backend only; both promise "best first" and a score of at least 0.

use super::{on_pool, Pool, Store, StoreRow};
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

/// The same words as [`fts_query`] as a PostgreSQL `tsquery` (`'w1' | 'w2'`); the words are
/// alphanumeric only, so no user text is tsquery syntax.
pub fn pg_tsquery(text: &str) -> Option<String> {
    let terms: Vec<String> = text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|t| !t.is_empty())
        .take(32)
        .map(|t| format!("'{t}'"))
        .collect();
    (!terms.is_empty()).then(|| terms.join(" | "))
}

/// Transcript search on SQLite: `$1` FTS5 query, `$2` tenant or NULL, `$3` limit.
const MESSAGES_SQLITE: &str = "SELECT s.session_key, s.agent_id, s.channel, m.created_at, \
     snippet(messages_fts, 0, '', '', '...', 24) AS snip, -bm25(messages_fts) AS score \
     FROM messages_fts JOIN messages m ON m.id = messages_fts.rowid \
     JOIN sessions s ON s.session_key = m.session_key \
     WHERE messages_fts MATCH $1 AND ($2 IS NULL OR s.tenant_id = $2) \
     ORDER BY bm25(messages_fts), m.id LIMIT $3";

/// Transcript search on PostgreSQL, same parameters (`$1` a tsquery); the snippet is made for
/// the rows kept only, since `ts_headline` parses the whole text again.
const MESSAGES_POSTGRES: &str = "SELECT s.session_key, s.agent_id, s.channel, h.created_at, h.score, \
     ts_headline('simple', h.content, to_tsquery('simple', $1), \
       'StartSel=\"\",StopSel=\"\",MaxWords=24,MinWords=8,ShortWord=0,MaxFragments=1,FragmentDelimiter=...') AS snip \
     FROM (SELECT m.id, m.session_key, m.content, m.created_at, \
             ts_rank(m.content_tsv, q, 1)::float8 AS score \
           FROM messages m JOIN sessions s2 ON s2.session_key = m.session_key, \
                to_tsquery('simple', $1) q \
           WHERE m.content_tsv @@ q AND ($2::text IS NULL OR s2.tenant_id = $2) \
           ORDER BY score DESC, m.id LIMIT $3) h \
     JOIN sessions s ON s.session_key = h.session_key \
     ORDER BY h.score DESC, h.id";

/// Memory search on SQLite: `$1` query, `$2` agent or NULL, `$3` tenant or NULL, `$4` limit.
const MEMORIES_SQLITE: &str =
    "SELECT m.id, m.agent_id, m.content, m.tags, m.session_key, m.created_at, \
     -bm25(memories_fts) AS score \
     FROM memories_fts JOIN memories m ON m.id = memories_fts.rowid \
     WHERE memories_fts MATCH $1 AND ($2 IS NULL OR m.agent_id = $2) \
     AND ($3 IS NULL OR m.tenant_id = $3) ORDER BY bm25(memories_fts), m.id LIMIT $4";

/// Memory search on PostgreSQL, same parameters.
const MEMORIES_POSTGRES: &str =
    "SELECT m.id, m.agent_id, m.content, m.tags, m.session_key, m.created_at, \
     ts_rank(m.content_tsv, q, 1)::float8 AS score \
     FROM memories m, to_tsquery('simple', $1) q \
     WHERE m.content_tsv @@ q AND ($2::text IS NULL OR m.agent_id = $2) \
     AND ($3::text IS NULL OR m.tenant_id = $3) ORDER BY score DESC, m.id LIMIT $4";

fn message_hit(r: &impl StoreRow) -> Result<MessageHit, sqlx::Error> {
    Ok(MessageHit {
        session_key: r.col("session_key")?,
        agent_id: r.col("agent_id")?,
        channel: r.col("channel")?,
        snippet: clip(r.col("snip")?, 1000),
        score: r.col::<f64>("score")?.max(0.0),
        timestamp: r.col("created_at")?,
    })
}

fn memory_hit(r: &impl StoreRow) -> Result<MemoryHit, sqlx::Error> {
    Ok(MemoryHit {
        id: r.col("id")?,
        agent_id: r.col("agent_id")?,
        content: r.col("content")?,
        tags: r.col("tags")?,
        session_key: r.col("session_key")?,
        score: r.col::<f64>("score")?.max(0.0),
        created_at: r.col("created_at")?,
    })
}

/// The query text and SQL of a search for the store's backend; None when the text has no word.
fn for_backend(
    pool: &Pool,
    text: &str,
    sqlite: &'static str,
    postgres: &'static str,
) -> Option<(String, &'static str)> {
    match pool {
        Pool::Sqlite(_) => fts_query(text).map(|q| (q, sqlite)),
        Pool::Postgres(_) => pg_tsquery(text).map(|q| (q, postgres)),
    }
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
        let Some((q, sql)) = for_backend(self.pool(), text, MESSAGES_SQLITE, MESSAGES_POSTGRES)
        else {
            return Ok(Vec::new());
        };
        Ok(on_pool!(self.pool(), |p| {
            let rows = sqlx::query(sql)
                .bind(&q)
                .bind(tenant.only())
                .bind(limit)
                .fetch_all(p)
                .await?;
            rows.iter().map(message_hit).collect::<Result<_, _>>()?
        }))
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
        let Some((q, sql)) = for_backend(self.pool(), text, MEMORIES_SQLITE, MEMORIES_POSTGRES)
        else {
            return Ok(Vec::new());
        };
        Ok(on_pool!(self.pool(), |p| {
            let rows = sqlx::query(sql)
                .bind(&q)
                .bind(agent_id)
                .bind(tenant.only())
                .bind(limit)
                .fetch_all(p)
                .await?;
            rows.iter().map(memory_hit).collect::<Result<_, _>>()?
        }))
    }

    /// Counts for the memory dashboard over what `tenant` reaches: memories, notes, indexed
    /// transcript messages.
    pub async fn memory_stats(&self, tenant: &Tenant) -> Result<(i64, i64, i64), GatewayError> {
        Ok(on_pool!(self.pool(), |p| {
            let row = sqlx::query(
                "SELECT (SELECT COUNT(*) FROM memories WHERE $1 IS NULL OR tenant_id = $1) AS memories, \
                        (SELECT COUNT(*) FROM session_notes n JOIN sessions s ON s.session_key = n.session_key \
                         WHERE $1 IS NULL OR s.tenant_id = $1) AS notes, \
                        (SELECT COUNT(*) FROM messages m JOIN sessions s ON s.session_key = m.session_key \
                         WHERE $1 IS NULL OR s.tenant_id = $1) AS messages",
            )
            .bind(tenant.only())
            .fetch_one(p)
            .await?;
            (
                row.col("memories")?,
                row.col("notes")?,
                row.col("messages")?,
            )
        }))
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
