//! The `usage` table: one row per model call (tokens, cost, latency, outcome) per agent,
//! session and provider; the observability methods read it.
//!
//! Rows are written behind the request: `usage_record` queues the row and returns; one
//! writer task takes every row queued meanwhile into one INSERT (group commit), so a model
//! call never waits for SQLite and under load one commit serves many calls. Readers call
//! `usage_flush` first (the writer answers once every row queued before it is committed), so
//! they always see every call that finished before them; shutdown flushes too. A killed
//! process loses at most the rows of the last few milliseconds.

use tokio::sync::{mpsc, oneshot};

use super::{on_pool, Pool, Store, StoreRow};
use crate::error::GatewayError;

/// One model call.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UsageRow {
    pub ts: i64,
    pub agent_id: String,
    pub session_key: Option<String>,
    pub provider: String,
    pub model: String,
    /// chat, summarize, embed, test.
    pub operation: String,
    pub input_tokens: i64,
    pub output_tokens: i64,
    pub cached_tokens: i64,
    pub cost_usd: f64,
    pub latency_ms: i64,
    pub ok: bool,
    pub error_kind: Option<String>,
}

/// Prompt-cache figures of one provider (or of all).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CacheFigures {
    pub provider: String,
    pub hits: i64,
    pub misses: i64,
    pub cached_tokens: i64,
}

/// Rows per transaction at most (13 bound values each, well under SQLite's limit).
const MAX_BATCH: usize = 500;

enum Item {
    Row(UsageRow),
    /// Answered once every row queued before it is committed.
    Flush(oneshot::Sender<()>),
}

/// The queue in front of the usage writer task.
#[derive(Clone)]
pub struct UsageQueue {
    tx: mpsc::UnboundedSender<Item>,
}

impl UsageQueue {
    pub fn start(pool: Pool) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(write_loop(pool, rx));
        Self { tx }
    }
}

/// How long the writer lets rows gather after the first one: under load a batch holds
/// every row of the window (a few large INSERTs and one commit instead of many small ones);
/// alone, a row waits this long (readers and shutdown flush first, so nobody sees the wait).
const GATHER: std::time::Duration = std::time::Duration::from_millis(50);

async fn write_loop(pool: Pool, mut rx: mpsc::UnboundedReceiver<Item>) {
    while let Some(first) = rx.recv().await {
        let mut rows = Vec::new();
        let mut flushes = Vec::new();
        let mut next = Some(first);
        let mut waited = false;
        loop {
            while let Some(item) = next.take() {
                match item {
                    Item::Row(r) => rows.push(r),
                    Item::Flush(f) => flushes.push(f),
                }
                if rows.len() < MAX_BATCH {
                    next = rx.try_recv().ok();
                }
            }
            // A flush is answered at once; otherwise let the batch fill for a moment.
            if waited || !flushes.is_empty() || rows.len() >= MAX_BATCH {
                break;
            }
            tokio::time::sleep(GATHER).await;
            waited = true;
            next = rx.try_recv().ok();
        }
        if !rows.is_empty() {
            if let Err(e) = insert_batch(&pool, &rows).await {
                tracing::error!(error = %e, rows = rows.len(), "usage rows not recorded");
            }
        }
        for f in flushes {
            let _ = f.send(());
        }
    }
}

/// Rows per INSERT statement: a batch goes in as statements of these sizes (largest first),
/// so the database prepares a handful of statements once and every value is bound directly
/// (64 × 13 = 832 parameters at most, within both backends' limits).
const CHUNKS: [usize; 4] = [64, 16, 4, 1];
const COLUMNS: &str = "INSERT INTO usage (ts, agent_id, session_key, provider, model, operation, \
     input_tokens, output_tokens, cached_tokens, cost_usd, latency_ms, ok, error_kind) VALUES ";

/// The INSERT of `n` rows (built once per size).
fn insert_sql(n: usize) -> &'static str {
    static SQL: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    let all = SQL.get_or_init(|| {
        CHUNKS
            .iter()
            .map(|&n| {
                let rows: Vec<String> = (0..n)
                    .map(|r| {
                        let cols: Vec<String> =
                            (1..=13).map(|c| format!("${}", r * 13 + c)).collect();
                        format!("({})", cols.join(","))
                    })
                    .collect();
                format!("{COLUMNS}{}", rows.join(","))
            })
            .collect()
    });
    let at = CHUNKS
        .iter()
        .position(|&c| c == n)
        .unwrap_or(CHUNKS.len() - 1);
    &all[at]
}

/// The batch split into statement-sized chunks, largest first.
fn chunks(batch: &[UsageRow]) -> Vec<&[UsageRow]> {
    let mut out = Vec::new();
    let mut rest = batch;
    for size in CHUNKS {
        while rest.len() >= size {
            let (chunk, tail) = rest.split_at(size);
            out.push(chunk);
            rest = tail;
        }
    }
    out
}

/// The INSERT of one chunk, every value bound (a macro: the same for both backends).
macro_rules! insert {
    ($chunk:expr) => {{
        let mut q = sqlx::query(insert_sql($chunk.len()));
        for u in $chunk.iter() {
            q = q
                .bind(u.ts)
                .bind(&u.agent_id)
                .bind(&u.session_key)
                .bind(&u.provider)
                .bind(&u.model)
                .bind(&u.operation)
                .bind(u.input_tokens)
                .bind(u.output_tokens)
                .bind(u.cached_tokens)
                .bind(u.cost_usd)
                .bind(u.latency_ms)
                .bind(i64::from(u.ok))
                .bind(&u.error_kind);
        }
        q
    }};
}

/// The batch atomically: one statement on its own, several in one transaction.
async fn insert_batch(pool: &Pool, batch: &[UsageRow]) -> Result<(), sqlx::Error> {
    on_pool!(pool, |p| match chunks(batch).as_slice() {
        [] => Ok(()),
        [one] => insert!(one).execute(p).await.map(drop),
        many => {
            let mut tx = p.begin().await?;
            for chunk in many {
                insert!(chunk).execute(&mut *tx).await?;
            }
            tx.commit().await
        }
    })
}

impl Store {
    /// Queues one model call's row (written behind the request).
    pub fn usage_record(&self, u: UsageRow) -> Result<(), GatewayError> {
        self.usage
            .tx
            .send(Item::Row(u))
            .map_err(|_| GatewayError::Internal("usage writer stopped".into()))
    }

    /// Waits until every row queued so far is committed.
    pub async fn usage_flush(&self) -> Result<(), GatewayError> {
        let (ack, done) = oneshot::channel();
        self.usage
            .tx
            .send(Item::Flush(ack))
            .map_err(|_| GatewayError::Internal("usage writer stopped".into()))?;
        done.await
            .map_err(|_| GatewayError::Internal("usage writer stopped".into()))
    }

    /// Cache hits/misses per provider over successful calls, optionally for one agent and
    /// from a time on.
    pub async fn usage_cache_figures(
        &self,
        agent_id: Option<&str>,
        since_ms: Option<i64>,
    ) -> Result<Vec<CacheFigures>, GatewayError> {
        self.usage_flush().await?;
        // CAST: PostgreSQL sums BIGINT as numeric; the same value on SQLite.
        Ok(on_pool!(self.pool(), |p| {
            let rows = sqlx::query(
                "SELECT provider, CAST(SUM(CASE WHEN cached_tokens > 0 THEN 1 ELSE 0 END) AS BIGINT) AS hits, \
                 CAST(SUM(CASE WHEN cached_tokens > 0 THEN 0 ELSE 1 END) AS BIGINT) AS misses, \
                 CAST(SUM(cached_tokens) AS BIGINT) AS cached FROM usage \
                 WHERE ok = 1 AND ($1 IS NULL OR agent_id = $1) AND ($2 IS NULL OR ts >= $2) \
                 GROUP BY provider ORDER BY provider",
            )
            .bind(agent_id)
            .bind(since_ms)
            .fetch_all(p)
            .await?;
            let mut out = Vec::with_capacity(rows.len());
            for r in &rows {
                out.push(CacheFigures {
                    provider: r.col("provider")?,
                    hits: r.col("hits")?,
                    misses: r.col("misses")?,
                    cached_tokens: r.col("cached")?,
                });
            }
            out
        }))
    }

    /// Cached tokens per model (for the saving estimate), same filters.
    pub async fn usage_cached_by_model(
        &self,
        agent_id: Option<&str>,
        since_ms: Option<i64>,
    ) -> Result<Vec<(String, i64)>, GatewayError> {
        self.usage_flush().await?;
        Ok(on_pool!(self.pool(), |p| {
            let rows = sqlx::query(
                "SELECT model, CAST(SUM(cached_tokens) AS BIGINT) AS cached FROM usage \
                 WHERE ok = 1 AND cached_tokens > 0 AND ($1 IS NULL OR agent_id = $1) AND ($2 IS NULL OR ts >= $2) \
                 GROUP BY model ORDER BY model",
            )
            .bind(agent_id)
            .bind(since_ms)
            .fetch_all(p)
            .await?;
            let mut out = Vec::with_capacity(rows.len());
            for r in &rows {
                out.push((r.col("model")?, r.col("cached")?));
            }
            out
        }))
    }
}

#[cfg(test)]
mod chunk_tests {
    use super::*;

    #[test]
    fn batches_split_into_statement_sizes_largest_first() {
        let rows = |n| vec![UsageRow::default(); n];
        let sizes = |n| chunks(&rows(n)).iter().map(|c| c.len()).collect::<Vec<_>>();
        assert_eq!(sizes(0), Vec::<usize>::new());
        assert_eq!(sizes(1), [1]);
        assert_eq!(sizes(64), [64]);
        assert_eq!(sizes(27), [16, 4, 4, 1, 1, 1]);
        assert_eq!(sizes(MAX_BATCH).iter().sum::<usize>(), MAX_BATCH);
    }

    #[tokio::test]
    async fn one_statement_and_many_statement_batches_are_all_written() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("t.db")).await.unwrap();
        for (n, total) in [(1usize, 1i64), (27, 28), (64, 92)] {
            let batch: Vec<UsageRow> = (0..n)
                .map(|i| UsageRow {
                    ts: i as i64,
                    agent_id: "a".into(),
                    provider: "p".into(),
                    model: "p/m".into(),
                    operation: "chat".into(),
                    ok: true,
                    ..UsageRow::default()
                })
                .collect();
            insert_batch(store.pool(), &batch).await.unwrap();
            let count: i64 = on_pool!(store.pool(), |p| sqlx::query_scalar(
                "SELECT COUNT(*) FROM usage"
            )
            .fetch_one(p)
            .await
            .unwrap());
            assert_eq!(count, total);
        }
    }
}
