//! The `usage` table: one row per model call (tokens, cost, latency, outcome) per agent,
//! session and provider, and its hourly rollup `usage_hourly`; the billing methods read them.
//! The same writer records the observability rows (`obs.rs`: the session index, diagnostic
//! events, prompt reports, channel activity).
//!
//! Rows are written behind the request: `usage_record` (and `obs_record`) queue the row and
//! return; one writer task takes every row queued meanwhile into one transaction of
//! multi-row INSERTs (group commit, `batch.rs`), so a model call never waits
//! for the database and under load one commit serves many calls. Readers call `usage_flush`
//! first (the writer answers once every row queued before it is committed), so they always
//! see every call that finished before them; shutdown flushes too. A killed process loses at
//! most the usage rows of the last few milliseconds, and the observability rows of the last
//! second (they wait longer, so that one commit serves many turns).
//! Usage rows are never dropped: when [`MAX_QUEUED_USAGE`] wait, model calls wait to start
//! (`usage_room`); observability rows are dropped (and counted) when more than
//! [`MAX_QUEUED_OBS`] wait. Either way a slow or stalled database cannot grow the queue
//! without bound.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{mpsc, oneshot};

use super::batch::{self, MultiInsert};
use super::obs::{ObsBatch, ObsRow};
use super::{on_pool, Pool, Store};
use crate::api::error::GatewayError;

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
    pub cache_write_tokens: i64,
    pub cost_usd: f64,
    /// What the cached tokens saved, at the prices of the call's time.
    pub cache_saved_usd: f64,
    pub latency_ms: i64,
    pub ok: bool,
    pub error_kind: Option<String>,
}

/// Rows per transaction at most (15 bound values each, well under SQLite's limit).
const MAX_BATCH: usize = 500;

/// Observability rows that may wait for the writer at most; more are dropped and counted.
pub const MAX_QUEUED_OBS: usize = 20_000;

/// Usage rows that may wait for the writer before model calls wait too: billing rows are
/// never dropped, so a store slower than the load holds new calls back (backpressure,
/// counted in `agentgw_recorder_backpressure_total`) instead of letting the queue, and the
/// process's memory, grow for as long as the load lasts.
pub const MAX_QUEUED_USAGE: usize = 20_000;

enum Item {
    Row(UsageRow),
    Obs(ObsRow),
    /// Answered once every row queued before it is committed.
    Flush(oneshot::Sender<()>),
}

/// The queue in front of the writer task.
#[derive(Clone)]
pub struct UsageQueue {
    tx: mpsc::UnboundedSender<Item>,
    /// Rows queued and not yet taken by the writer (usage and observability).
    queued: Arc<AtomicUsize>,
    /// Observability rows among them.
    queued_obs: Arc<AtomicUsize>,
    /// Observability rows dropped because [`MAX_QUEUED_OBS`] already waited.
    dropped_obs: Arc<std::sync::atomic::AtomicU64>,
    /// Usage rows among the queued ones.
    queued_usage: Arc<AtomicUsize>,
    /// Told each time the writer takes rows (model calls held back by [`MAX_QUEUED_USAGE`]
    /// wait for it).
    room: Arc<tokio::sync::Notify>,
}

impl UsageQueue {
    pub fn start(pool: Pool) -> Self {
        let (queue, rx) = Self::unstarted();
        queue.start_writer(pool, rx);
        queue
    }

    /// The queue without its writer: rows wait until [`Self::start_writer`] (a stalled store,
    /// in tests).
    fn unstarted() -> (Self, mpsc::UnboundedReceiver<Item>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let queue = Self {
            tx,
            queued: Arc::default(),
            queued_obs: Arc::default(),
            dropped_obs: Arc::default(),
            queued_usage: Arc::default(),
            room: Arc::default(),
        };
        (queue, rx)
    }

    fn start_writer(&self, pool: Pool, rx: mpsc::UnboundedReceiver<Item>) {
        let counts = Counts {
            queued: self.queued.clone(),
            queued_obs: self.queued_obs.clone(),
            queued_usage: self.queued_usage.clone(),
            room: self.room.clone(),
        };
        #[allow(
            clippy::disallowed_methods,
            reason = "the usage writer ends when its channel closes (the store is dropped)"
        )]
        tokio::spawn(write_loop(pool, rx, counts));
    }

    /// Rows waiting for the writer.
    pub fn depth(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }
}

/// How long observability rows wait for more at most (they are committed together).
const OBS_GATHER: std::time::Duration = std::time::Duration::from_secs(1);
/// Observability rows per transaction at most.
const MAX_OBS_BATCH: usize = 2000;

/// How long the writer lets rows gather after the first one: under load a batch holds
/// every row of the window (a few large INSERTs and one commit instead of many small ones);
/// alone, a row waits this long (readers and shutdown flush first, so nobody sees the wait).
const GATHER: std::time::Duration = std::time::Duration::from_millis(50);

/// The queue's counters, shared by the writer and the handles that queue rows.
struct Counts {
    queued: Arc<AtomicUsize>,
    queued_obs: Arc<AtomicUsize>,
    queued_usage: Arc<AtomicUsize>,
    room: Arc<tokio::sync::Notify>,
}

async fn write_loop(pool: Pool, mut rx: mpsc::UnboundedReceiver<Item>, counts: Counts) {
    let Counts {
        queued,
        queued_obs,
        queued_usage,
        room,
    } = counts;
    // Observability rows wait across batches, up to OBS_GATHER or MAX_OBS_BATCH: one commit
    // then serves many turns even when calls come one at a time (a commit's page writes cost
    // more than a row's inserts).
    let mut obs = ObsBatch::default();
    let mut obs_since: Option<Instant> = None;
    loop {
        let first = match obs_since {
            Some(t) => {
                match tokio::time::timeout(OBS_GATHER.saturating_sub(t.elapsed()), rx.recv()).await
                {
                    Ok(Some(item)) => Some(item),
                    Ok(None) => break,
                    Err(_) => None,
                }
            }
            None => match rx.recv().await {
                Some(item) => Some(item),
                None => break,
            },
        };
        let mut rows = Vec::new();
        let mut flushes = Vec::new();
        let mut taken = 0;
        let mut next = first;
        let mut waited = next.is_none();
        loop {
            while let Some(item) = next.take() {
                match item {
                    Item::Row(r) => {
                        taken += 1;
                        rows.push(r);
                    }
                    Item::Obs(r) => {
                        taken += 1;
                        queued_obs.fetch_sub(1, Ordering::Relaxed);
                        obs_since.get_or_insert_with(Instant::now);
                        obs.push(r);
                    }
                    Item::Flush(f) => flushes.push(f),
                }
                if rows.len() < MAX_BATCH && obs.len() < MAX_OBS_BATCH {
                    next = rx.try_recv().ok();
                }
            }
            // A flush is answered at once; otherwise let the batch fill for a moment.
            if waited
                || !flushes.is_empty()
                || rows.len() >= MAX_BATCH
                || obs.len() >= MAX_OBS_BATCH
            {
                break;
            }
            tokio::time::sleep(GATHER).await;
            waited = true;
            next = rx.try_recv().ok();
        }
        let left = queued
            .fetch_sub(taken, Ordering::Relaxed)
            .saturating_sub(taken);
        if !rows.is_empty() {
            queued_usage.fetch_sub(rows.len(), Ordering::Relaxed);
            room.notify_waiters();
        }
        crate::metrics::set_queue_depth("usage_writer", left);
        if !rows.is_empty() {
            insert_with_retries(&pool, &rows).await;
        }
        let due = obs_since.is_some_and(|t| t.elapsed() >= OBS_GATHER);
        if !obs.is_empty() && (due || !flushes.is_empty() || obs.len() >= MAX_OBS_BATCH) {
            write_obs(&pool, &mut obs).await;
            obs_since = None;
        }
        for f in flushes {
            let _ = f.send(());
        }
    }
    // The queue closed (the store is gone): what waits is still written.
    if !obs.is_empty() {
        write_obs(&pool, &mut obs).await;
    }
}

/// Tries a usage batch again after a failure (a locked or briefly unreachable database), so
/// that a transient error loses no billing row; a batch that fails every attempt is logged
/// with its size and counted (`agentgw_recorder_dropped_total{kind="usage"}`).
async fn insert_with_retries(pool: &Pool, rows: &[UsageRow]) {
    const ATTEMPTS: u32 = 4;
    for attempt in 1..=ATTEMPTS {
        match insert_batch(pool, rows).await {
            Ok(()) => return,
            Err(e) if attempt < ATTEMPTS => {
                tracing::warn!(error = %e, rows = rows.len(), attempt, "usage rows not recorded yet; trying again");
                tokio::time::sleep(std::time::Duration::from_millis(250 << attempt)).await;
            }
            Err(e) => {
                tracing::error!(error = %e, rows = rows.len(), "usage rows not recorded");
                crate::metrics::recorder_dropped("usage", rows.len() as u64);
            }
        }
    }
}

async fn write_obs(pool: &Pool, obs: &mut ObsBatch) {
    let batch = std::mem::take(obs);
    if let Err(e) = super::obs::write_batch(pool, &batch).await {
        tracing::error!(error = %e, rows = batch.len(), "observability rows not recorded");
    }
}

/// The usage INSERT for each chunk size.
static INSERT_USAGE: MultiInsert = MultiInsert::new(
    "INSERT INTO usage (ts, agent_id, session_key, provider, model, operation, \
     input_tokens, output_tokens, cached_tokens, cost_usd, latency_ms, ok, error_kind, \
     cache_write_tokens, cache_saved_usd) VALUES ",
    15,
);

/// The INSERT of one chunk, every value bound (a macro: the same for both backends).
macro_rules! insert {
    ($pool:expr, $chunk:expr) => {{
        let mut q = sqlx::query(super::dialect::sql($pool, INSERT_USAGE.text($chunk.len())));
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
                .bind(&u.error_kind)
                .bind(u.cache_write_tokens)
                .bind(u.cache_saved_usd);
        }
        q
    }};
}

/// The hourly sums of a batch, per (hour, agent, provider, model).
#[derive(Default)]
struct Hourly {
    calls: i64,
    failed_calls: i64,
    cache_hits: i64,
    input_tokens: i64,
    output_tokens: i64,
    cached_tokens: i64,
    cache_write_tokens: i64,
    cost_usd: f64,
    cache_saved_usd: f64,
}

/// The start of the UTC hour of `ts` (epoch ms).
pub fn hour_of(ts: i64) -> i64 {
    ts.div_euclid(HOUR_MS) * HOUR_MS
}

pub const HOUR_MS: i64 = 3_600_000;

fn hourly(batch: &[UsageRow]) -> BTreeMap<(i64, &str, &str, &str), Hourly> {
    let mut out: BTreeMap<(i64, &str, &str, &str), Hourly> = BTreeMap::new();
    for u in batch {
        let h = out
            .entry((hour_of(u.ts), &u.agent_id, &u.provider, &u.model))
            .or_default();
        if !u.ok {
            h.failed_calls += 1;
            continue;
        }
        h.calls += 1;
        h.cache_hits += i64::from(u.cached_tokens > 0);
        h.input_tokens += u.input_tokens;
        h.output_tokens += u.output_tokens;
        h.cached_tokens += u.cached_tokens;
        h.cache_write_tokens += u.cache_write_tokens;
        h.cost_usd += u.cost_usd;
        h.cache_saved_usd += u.cache_saved_usd;
    }
    out
}

const UPSERT_HOURLY: &str = "INSERT INTO usage_hourly (hour_ms, agent_id, provider, model, calls, \
     failed_calls, cache_hits, input_tokens, output_tokens, cached_tokens, cache_write_tokens, \
     cost_usd, cache_saved_usd) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13) \
     ON CONFLICT (hour_ms, agent_id, provider, model) DO UPDATE SET \
     calls = usage_hourly.calls + excluded.calls, \
     failed_calls = usage_hourly.failed_calls + excluded.failed_calls, \
     cache_hits = usage_hourly.cache_hits + excluded.cache_hits, \
     input_tokens = usage_hourly.input_tokens + excluded.input_tokens, \
     output_tokens = usage_hourly.output_tokens + excluded.output_tokens, \
     cached_tokens = usage_hourly.cached_tokens + excluded.cached_tokens, \
     cache_write_tokens = usage_hourly.cache_write_tokens + excluded.cache_write_tokens, \
     cost_usd = usage_hourly.cost_usd + excluded.cost_usd, \
     cache_saved_usd = usage_hourly.cache_saved_usd + excluded.cache_saved_usd";

/// The batch and its hourly sums, atomically.
async fn insert_batch(pool: &Pool, batch: &[UsageRow]) -> Result<(), sqlx::Error> {
    let sums = hourly(batch);
    on_pool!(pool, |p| {
        let mut tx = p.begin().await?;
        for chunk in batch::chunks(batch) {
            insert!(p, chunk).execute(&mut *tx).await?;
        }
        for ((hour, agent, provider, model), h) in &sums {
            sqlx::query(super::dialect::sql(p, UPSERT_HOURLY))
                .bind(hour)
                .bind(agent)
                .bind(provider)
                .bind(model)
                .bind(h.calls)
                .bind(h.failed_calls)
                .bind(h.cache_hits)
                .bind(h.input_tokens)
                .bind(h.output_tokens)
                .bind(h.cached_tokens)
                .bind(h.cache_write_tokens)
                .bind(h.cost_usd)
                .bind(h.cache_saved_usd)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await
    })
}

impl Store {
    /// Queues one model call's row (written behind the request).
    pub fn usage_record(&self, u: UsageRow) -> Result<(), GatewayError> {
        let q = &self.usage;
        q.queued.fetch_add(1, Ordering::Relaxed);
        q.queued_usage.fetch_add(1, Ordering::Relaxed);
        q.tx.send(Item::Row(u)).map_err(|_| {
            q.queued.fetch_sub(1, Ordering::Relaxed);
            q.queued_usage.fetch_sub(1, Ordering::Relaxed);
            GatewayError::Internal("usage writer stopped".into())
        })
    }

    /// Returns at once while fewer than [`MAX_QUEUED_USAGE`] usage rows wait for the writer
    /// (one atomic read); otherwise waits until the writer has taken rows below it, counted
    /// once per held-back call. Called before each model call.
    pub async fn usage_room(&self) {
        let q = &self.usage;
        if q.queued_usage.load(Ordering::Relaxed) < MAX_QUEUED_USAGE {
            return;
        }
        crate::metrics::recorder_backpressure();
        loop {
            let notified = q.room.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if q.queued_usage.load(Ordering::Relaxed) < MAX_QUEUED_USAGE {
                return;
            }
            notified.await;
        }
    }

    /// Queues one observability row (written behind the request); dropped and counted when
    /// [`MAX_QUEUED_OBS`] rows already wait.
    pub fn obs_record(&self, row: ObsRow) {
        let q = &self.usage;
        if q.queued_obs.fetch_add(1, Ordering::Relaxed) >= MAX_QUEUED_OBS {
            q.queued_obs.fetch_sub(1, Ordering::Relaxed);
            q.dropped_obs.fetch_add(1, Ordering::Relaxed);
            crate::metrics::recorder_dropped(row.kind(), 1);
            return;
        }
        q.queued.fetch_add(1, Ordering::Relaxed);
        if q.tx.send(Item::Obs(row)).is_err() {
            q.queued.fetch_sub(1, Ordering::Relaxed);
            q.queued_obs.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Rows waiting for the writer (the `usage_writer` queue depth).
    pub fn recorder_depth(&self) -> usize {
        self.usage.depth()
    }

    /// Observability rows dropped so far because the queue was full
    /// (`agentgw_recorder_dropped_total` counts them by kind).
    pub fn recorder_dropped(&self) -> u64 {
        self.usage.dropped_obs.load(Ordering::Relaxed)
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
}

/// A successful call of agent `a` on `p/m` at `ts` (tests).
#[cfg(test)]
fn test_row(ts: i64) -> UsageRow {
    UsageRow {
        ts,
        agent_id: "a".into(),
        provider: "p".into(),
        model: "p/m".into(),
        operation: "chat".into(),
        ok: true,
        ..UsageRow::default()
    }
}

#[cfg(test)]
mod chunk_tests {
    use super::*;

    #[tokio::test]
    async fn one_statement_and_many_statement_batches_are_all_written() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("t.db")).await.unwrap();
        for (n, total) in [(1usize, 1i64), (27, 28), (64, 92)] {
            let batch: Vec<UsageRow> = (0..n).map(|i| test_row(i as i64)).collect();
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

#[cfg(test)]
mod queue_tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use crate::store::obs::DiagRow;

    fn diag(i: usize) -> ObsRow {
        ObsRow::Diag(DiagRow {
            ts: i as i64,
            category: "test",
            kind: "test.row",
            tenant_id: None,
            agent_id: None,
            session_key: None,
            channel_id: None,
            data: "{}".to_owned(),
        })
    }

    async fn count(store: &Store, table: &str) -> i64 {
        let sql = format!("SELECT COUNT(*) FROM {table}");
        on_pool!(store.pool(), |p| sqlx::query_scalar(&sql)
            .fetch_one(p)
            .await
            .unwrap())
    }

    /// A store whose writer has not started: rows wait until `queue.start_writer(.., rx)`.
    async fn stalled() -> (
        tempfile::TempDir,
        Store,
        UsageQueue,
        mpsc::UnboundedReceiver<Item>,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let opened = Store::open(&dir.path().join("t.db")).await.unwrap();
        let (queue, rx) = UsageQueue::unstarted();
        let store = Store {
            usage: queue.clone(),
            ..opened
        };
        (dir, store, queue, rx)
    }

    /// A store that does not move (its writer stalled): the calls on the answer path return at
    /// once (they are not async: nothing in them can wait), observability rows are kept up to
    /// the cap and the first one past it is dropped and counted, usage rows are never dropped;
    /// once the store moves again, everything kept is written.
    #[tokio::test]
    async fn a_stalled_store_never_holds_up_a_request_and_drops_only_past_the_cap() {
        let (_dir, store, queue, rx) = stalled().await;
        for i in 0..MAX_QUEUED_OBS {
            store.obs_record(diag(i));
        }
        assert_eq!(store.recorder_dropped(), 0, "at the cap nothing is dropped");
        store.obs_record(diag(MAX_QUEUED_OBS));
        assert_eq!(store.recorder_dropped(), 1, "one past the cap is dropped");
        for ts in 0..3 {
            store.usage_record(test_row(ts)).unwrap();
        }
        assert_eq!(store.recorder_dropped(), 1, "usage rows are never dropped");
        assert_eq!(store.recorder_depth(), MAX_QUEUED_OBS + 3);

        queue.start_writer(store.pool().clone(), rx);
        store.usage_flush().await.unwrap();
        assert_eq!(store.recorder_depth(), 0);
        assert_eq!(count(&store, "diagnostics").await, MAX_QUEUED_OBS as i64);
        assert_eq!(count(&store, "usage").await, 3);
    }

    /// Usage rows are never dropped: below [`MAX_QUEUED_USAGE`] waiting rows a model call
    /// starts at once; at it, the call waits (counted) until the writer has taken rows.
    #[tokio::test]
    async fn at_the_usage_cap_model_calls_wait_for_the_writer() {
        use futures_util::FutureExt;
        let (_dir, store, queue, rx) = stalled().await;
        for ts in 0..MAX_QUEUED_USAGE - 1 {
            store.usage_record(test_row(ts as i64)).unwrap();
        }
        assert!(
            store.usage_room().now_or_never().is_some(),
            "one below the cap, a call starts at once"
        );
        store.usage_record(test_row(0)).unwrap();
        let waiting = store.usage_room();
        tokio::pin!(waiting);
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(200), &mut waiting)
                .await
                .is_err(),
            "at the cap a call waits"
        );
        queue.start_writer(store.pool().clone(), rx);
        tokio::time::timeout(std::time::Duration::from_secs(30), waiting)
            .await
            .expect("the writer made room");
        store.usage_flush().await.unwrap();
        assert_eq!(count(&store, "usage").await, MAX_QUEUED_USAGE as i64);
        assert_eq!(store.recorder_depth(), 0);
        assert!(store.usage_room().now_or_never().is_some());
    }
}
