//! The `usage` table: one row per model call (tokens, cost, latency, outcome) per agent,
//! session and provider; the observability methods read it.
//!
//! Rows are written behind the request: `usage_record` queues the row and returns; one
//! writer task takes every row queued meanwhile into one INSERT (group commit), so a model
//! call never waits for SQLite and under load one commit serves many calls. Readers call
//! `usage_flush` first (the writer answers once every row queued before it is committed), so
//! they always see every call that finished before them; shutdown flushes too. A killed
//! process loses at most the rows of the last few milliseconds.

use sqlx::{Row, SqlitePool};
use tokio::sync::{mpsc, oneshot};

use super::Store;
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
    pub fn start(pool: SqlitePool) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(write_loop(pool, rx));
        Self { tx }
    }
}

/// How long the writer lets rows gather after the first one: under load a batch holds
/// every row of the window; alone, a row waits this long (readers flush, so nobody sees it).
const GATHER: std::time::Duration = std::time::Duration::from_millis(5);

async fn write_loop(pool: SqlitePool, mut rx: mpsc::UnboundedReceiver<Item>) {
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

/// One statement for any batch size (so SQLite prepares it once): the rows travel as one
/// JSON array and `json_each` unpacks them.
async fn insert_batch(pool: &SqlitePool, batch: &[UsageRow]) -> Result<(), sqlx::Error> {
    let rows: Vec<serde_json::Value> = batch
        .iter()
        .map(|u| {
            serde_json::json!([
                u.ts,
                u.agent_id,
                u.session_key,
                u.provider,
                u.model,
                u.operation,
                u.input_tokens,
                u.output_tokens,
                u.cached_tokens,
                u.cost_usd,
                u.latency_ms,
                i64::from(u.ok),
                u.error_kind
            ])
        })
        .collect();
    let json = serde_json::Value::Array(rows).to_string();
    sqlx::query(
        "INSERT INTO usage (ts, agent_id, session_key, provider, model, operation, input_tokens, \
         output_tokens, cached_tokens, cost_usd, latency_ms, ok, error_kind) \
         SELECT value->>0, value->>1, value->>2, value->>3, value->>4, value->>5, value->>6, \
                value->>7, value->>8, value->>9, value->>10, value->>11, value->>12 \
         FROM json_each(?)",
    )
    .bind(json)
    .execute(pool)
    .await?;
    Ok(())
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
        let rows = sqlx::query(
            "SELECT provider, SUM(CASE WHEN cached_tokens > 0 THEN 1 ELSE 0 END) AS hits, \
             SUM(CASE WHEN cached_tokens > 0 THEN 0 ELSE 1 END) AS misses, \
             SUM(cached_tokens) AS cached FROM usage \
             WHERE ok = 1 AND (? IS NULL OR agent_id = ?) AND (? IS NULL OR ts >= ?) \
             GROUP BY provider ORDER BY provider",
        )
        .bind(agent_id)
        .bind(agent_id)
        .bind(since_ms)
        .bind(since_ms)
        .fetch_all(self.pool())
        .await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            out.push(CacheFigures {
                provider: r.try_get("provider")?,
                hits: r.try_get("hits")?,
                misses: r.try_get("misses")?,
                cached_tokens: r.try_get("cached")?,
            });
        }
        Ok(out)
    }

    /// Cached tokens per model (for the saving estimate), same filters.
    pub async fn usage_cached_by_model(
        &self,
        agent_id: Option<&str>,
        since_ms: Option<i64>,
    ) -> Result<Vec<(String, i64)>, GatewayError> {
        self.usage_flush().await?;
        let rows = sqlx::query(
            "SELECT model, SUM(cached_tokens) AS cached FROM usage \
             WHERE ok = 1 AND cached_tokens > 0 AND (? IS NULL OR agent_id = ?) AND (? IS NULL OR ts >= ?) \
             GROUP BY model ORDER BY model",
        )
        .bind(agent_id)
        .bind(agent_id)
        .bind(since_ms)
        .bind(since_ms)
        .fetch_all(self.pool())
        .await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            out.push((r.try_get("model")?, r.try_get("cached")?));
        }
        Ok(out)
    }
}
