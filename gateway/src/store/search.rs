//! Full-text search over transcripts and agent memory: the one backend-specific part of the
//! store. SQLite uses FTS5 ranked by bm25; PostgreSQL a generated `tsvector` column with a GIN
//! index (configuration `simple`: lowercased words, no stemming, like FTS5's default tokenizer)
//! ranked by `ts_rank` with length normalisation, which orders results as bm25 does. Scores are
//! comparable within one backend only; both promise "best first" and a score of at least 0.

use super::{on_pool, Pool, Store, StoreRow};
use crate::api::error::GatewayError;
use crate::api::tenancy::Tenant;

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

/// The distinct words of free text (case-folded, at most 32): the only part of user text that
/// reaches a full-text query, each one quoted there, so no user text is query syntax.
fn query_words(text: &str) -> Vec<String> {
    let mut words: Vec<String> = Vec::new();
    for w in text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|t| !t.is_empty())
    {
        let w = w.to_lowercase();
        if !words.contains(&w) {
            words.push(w);
        }
        if words.len() == 32 {
            break;
        }
    }
    words
}

/// Above this many groups a covering query is no cheaper than the plain OR one (and its text
/// grows combinatorially): the OR query is used and the caller's own check applies.
const MAX_GROUPS: usize = 64;

/// The groups of a query matching entries that hold at least `need` of `words`: every
/// `need`-word combination, or one group per word (any word) when `need` is 1 or the
/// combinations would be too many.
fn groups(words: &[String], need: usize) -> Vec<Vec<&str>> {
    let m = words.len();
    let need = need.clamp(1, m.max(1));
    let mut count: usize = 1;
    for i in 0..need {
        count = count.saturating_mul(m - i) / (i + 1);
    }
    if need == 1 || count > MAX_GROUPS {
        return words.iter().map(|w| vec![w.as_str()]).collect();
    }
    let mut out = Vec::with_capacity(count);
    let mut pick: Vec<usize> = (0..need).collect();
    loop {
        out.push(pick.iter().map(|i| words[*i].as_str()).collect());
        // The next combination in lexicographic order.
        let Some(i) = (0..need).rev().find(|&i| pick[i] < m - need + i) else {
            break;
        };
        pick[i] += 1;
        for j in i + 1..need {
            pick[j] = pick[j - 1] + 1;
        }
    }
    out
}

/// Renders groups as a query: words quoted and joined by `and` within a group, groups joined
/// by `or`. None when there is no word.
fn render(groups: &[Vec<&str>], quote: char, and: &str, or: &str) -> Option<String> {
    let parts: Vec<String> = groups
        .iter()
        .map(|g| {
            let inner: Vec<String> = g.iter().map(|w| format!("{quote}{w}{quote}")).collect();
            if g.len() == 1 {
                inner.join("")
            } else {
                format!("({})", inner.join(and))
            }
        })
        .collect();
    (!parts.is_empty()).then(|| parts.join(or))
}

/// Turns free text into an FTS5 query matching entries with at least `need` of its distinct
/// words (1: any of them), ranked by bm25. None when the text has no word.
pub fn fts_query(text: &str, need: usize) -> Option<String> {
    render(&groups(&query_words(text), need), '"', " AND ", " OR ")
}

/// The same query as [`fts_query`] as a PostgreSQL `tsquery` (`('w1' & 'w2') | ...`).
pub fn pg_tsquery(text: &str, need: usize) -> Option<String> {
    render(&groups(&query_words(text), need), '\'', " & ", " | ")
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

use crate::config::memory::MEMORY_RANK_WINDOW;

/// Memory search on SQLite: `$1` query, `$2` agent or NULL, `$3` tenant or NULL, `$4` limit,
/// `$5` rank window. FTS5 walks the matches newest first (rowid order, no sort), so only the
/// window is ranked.
const MEMORIES_SQLITE: &str =
    "SELECT id, agent_id, content, tags, session_key, created_at, score FROM \
     (SELECT m.id, m.agent_id, m.content, m.tags, m.session_key, m.created_at, \
       -bm25(memories_fts) AS score \
     FROM memories_fts JOIN memories m ON m.id = memories_fts.rowid \
     WHERE memories_fts MATCH $1 AND ($2 IS NULL OR m.agent_id = $2) \
     AND ($3 IS NULL OR m.tenant_id = $3) ORDER BY memories_fts.rowid DESC LIMIT $5) \
     ORDER BY score DESC, id LIMIT $4";

/// Memory search on PostgreSQL, same parameters.
const MEMORIES_POSTGRES: &str =
    "SELECT id, agent_id, content, tags, session_key, created_at, score FROM \
     (SELECT m.id, m.agent_id, m.content, m.tags, m.session_key, m.created_at, \
       ts_rank(m.content_tsv, q, 1)::float8 AS score \
     FROM memories m, to_tsquery('simple', $1) q \
     WHERE m.content_tsv @@ q AND ($2::text IS NULL OR m.agent_id = $2) \
     AND ($3::text IS NULL OR m.tenant_id = $3) ORDER BY m.id DESC LIMIT $5) w \
     ORDER BY score DESC, id LIMIT $4";

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
    need: usize,
    sqlite: &'static str,
    postgres: &'static str,
) -> Option<(String, &'static str)> {
    match pool {
        Pool::Sqlite(_) => fts_query(text, need).map(|q| (q, sqlite)),
        Pool::Postgres(_) => pg_tsquery(text, need).map(|q| (q, postgres)),
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
        let Some((q, sql)) = for_backend(self.pool(), text, 1, MESSAGES_SQLITE, MESSAGES_POSTGRES)
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
        self.search_memories_covering(tenant, agent_id, text, 1, limit, MEMORY_RANK_WINDOW)
            .await
    }

    /// [`Store::search_memories`] over the entries holding at least `need` of the text's
    /// distinct words only (for up to 64 word combinations; past that, any word
    /// matches and the caller checks coverage itself). Cheaper than filtering afterwards: the
    /// index intersects the words' lists, so far fewer rows are ranked. Only the newest
    /// `window` matches are ranked.
    pub async fn search_memories_covering(
        &self,
        tenant: &Tenant,
        agent_id: Option<&str>,
        text: &str,
        need: usize,
        limit: i64,
        window: usize,
    ) -> Result<Vec<MemoryHit>, GatewayError> {
        let Some((q, sql)) =
            for_backend(self.pool(), text, need, MEMORIES_SQLITE, MEMORIES_POSTGRES)
        else {
            return Ok(Vec::new());
        };
        Ok(on_pool!(self.pool(), |p| {
            let rows = sqlx::query(sql)
                .bind(&q)
                .bind(agent_id)
                .bind(tenant.only())
                .bind(limit)
                .bind(i64::try_from(window).unwrap_or(i64::MAX))
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
    use super::{fts_query, pg_tsquery};

    #[test]
    fn user_text_never_becomes_fts_syntax() {
        assert_eq!(
            fts_query("weather OR \"x\" NEAR(a b)", 1).as_deref(),
            Some("\"weather\" OR \"or\" OR \"x\" OR \"near\" OR \"a\" OR \"b\"")
        );
        assert_eq!(fts_query("*** ---", 1), None);
        assert_eq!(
            pg_tsquery("it's | me", 1).as_deref(),
            Some("'it' | 's' | 'me'")
        );
    }

    #[test]
    fn covering_queries_name_every_combination_of_the_needed_words() {
        assert_eq!(
            fts_query("Cat sat mat cat", 2).as_deref(),
            Some("(\"cat\" AND \"sat\") OR (\"cat\" AND \"mat\") OR (\"sat\" AND \"mat\")")
        );
        assert_eq!(
            pg_tsquery("a b", 2).as_deref(),
            Some("('a' & 'b')"),
            "all of two words"
        );
        assert_eq!(
            fts_query("a b c d", 3).map(|q| q.matches(" OR ").count() + 1),
            Some(4)
        );
        // More words than the combinations allow: any word matches (the caller checks).
        let long = "a b c d e f g h i j";
        assert_eq!(fts_query(long, 6), fts_query(long, 1));
        // `need` past the word count means all of them; 0 means any.
        assert_eq!(fts_query("a b", 5), fts_query("a b", 2));
        assert_eq!(fts_query("a b", 0), fts_query("a b", 1));
    }
}
