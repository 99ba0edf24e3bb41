//! The observability tables (migration 0008): the session index `trace_rows`, `diagnostics`,
//! `prompt_reports` and `channel_activity`, written behind the request by the writer task of
//! `usage.rs` ([`ObsRow`], [`write_batch`]) and read by the `obs.*` methods; the billing sums
//! over `usage` and `usage_hourly`; retention sweeps and resets.
//!
//! Every row is content-free: ids, names, counts, timings, codes and digests.

use std::collections::BTreeMap;

use super::batch::{self, MultiInsert};
use super::usage::{hour_of, HOUR_MS};
use super::{on_pool, text, Pool, Store, StoreRow};
use crate::api::error::GatewayError;
use crate::api::generated::types::ObsContextDagResultSnapshotsItemCompactionsItem;
use crate::api::tenancy::Tenant;
use crate::store::filter::{Filter, Value};
use crate::store::records::{
    GateFire, GateRecord, GatedFire, ToolResultFact, TraceFact, UsageFacts,
};

/// One row of the session index.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TraceRow {
    pub ts: i64,
    pub seq: i64,
    /// inbound | outbound | tool_result | turn_end | error
    pub kind: &'static str,
    pub session_key: String,
    pub tenant_id: Option<String>,
    pub chat_id: Option<String>,
    pub message_id: Option<String>,
    pub trace_id: String,
    pub agent_id: Option<String>,
    pub channel: Option<String>,
    pub tool_name: Option<String>,
    pub status: Option<&'static str>,
    pub duration_ms: Option<i64>,
    pub tokens: Option<i64>,
    pub cost_usd: Option<f64>,
    pub synthetic: bool,
    pub finish_reason: Option<&'static str>,
    pub error_kind: Option<String>,
    pub result_digest: Option<String>,
    pub result_bytes: Option<i64>,
    /// Content-free JSON (a turn end's context budget).
    pub detail: Option<String>,
    /// A turn end whose answer came from a fallback model, not the one asked for first.
    pub fallback: bool,
}

/// One diagnostic event.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DiagRow {
    pub ts: i64,
    /// usage | webhook | message | session
    pub category: &'static str,
    pub kind: &'static str,
    /// The owner of the session involved (rpc callers see only their own); None: operator only.
    pub tenant_id: Option<String>,
    pub agent_id: Option<String>,
    pub session_key: Option<String>,
    pub channel_id: Option<String>,
    /// Content-free JSON object.
    pub data: String,
}

/// One system prompt report (JSON of the catalogue's ObsSystemPromptReport).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PromptRow {
    pub session_key: String,
    pub agent_id: String,
    pub run_id: Option<String>,
    pub created_at: i64,
    pub report: String,
}

/// Messages in and out on a channel.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChannelTouch {
    pub channel_id: String,
    pub channel_type: String,
    pub ts: i64,
    pub sent: i64,
    pub received: i64,
}

/// A row for the writer task.
#[derive(Debug, Clone, PartialEq)]
pub enum ObsRow {
    Trace(Box<TraceRow>),
    Diag(DiagRow),
    Prompt(PromptRow),
    Channel(ChannelTouch),
}

impl ObsRow {
    /// The metric label of the row's kind.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Trace(_) => "trace",
            Self::Diag(_) => "diagnostic",
            Self::Prompt(_) => "prompt_report",
            Self::Channel(_) => "channel",
        }
    }
}

/// The observability rows of one writer batch.
#[derive(Debug, Default)]
pub struct ObsBatch {
    trace: Vec<TraceRow>,
    diag: Vec<DiagRow>,
    prompts: Vec<PromptRow>,
    /// Summed per channel id.
    channels: BTreeMap<String, ChannelTouch>,
    rows: usize,
}

impl ObsBatch {
    pub fn push(&mut self, row: ObsRow) {
        self.rows += 1;
        match row {
            ObsRow::Trace(t) => self.trace.push(*t),
            ObsRow::Diag(d) => self.diag.push(d),
            ObsRow::Prompt(p) => self.prompts.push(p),
            ObsRow::Channel(c) => {
                let e = self
                    .channels
                    .entry(c.channel_id.clone())
                    .or_insert_with(|| ChannelTouch {
                        sent: 0,
                        received: 0,
                        ..c.clone()
                    });
                e.ts = e.ts.max(c.ts);
                e.sent += c.sent;
                e.received += c.received;
            }
        }
    }

    pub fn len(&self) -> usize {
        self.rows
    }

    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }
}

static INSERT_TRACE: MultiInsert = MultiInsert::new(
    "INSERT INTO trace_rows (ts, seq, kind, session_key, tenant_id, chat_id, \
     message_id, trace_id, agent_id, channel, tool_name, status, duration_ms, tokens, cost_usd, \
     synthetic, finish_reason, error_kind, result_digest, result_bytes, detail, fallback) VALUES ",
    22,
);

static INSERT_DIAG: MultiInsert = MultiInsert::new(
    "INSERT INTO diagnostics (ts, category, type, tenant_id, agent_id, \
     session_key, channel_id, data) VALUES ",
    8,
);

static INSERT_PROMPT: MultiInsert = MultiInsert::new(
    "INSERT INTO prompt_reports (session_key, agent_id, run_id, created_at, \
     report) VALUES ",
    5,
);

const UPSERT_CHANNEL: &str = "INSERT INTO channel_activity (channel_id, channel_type, last_active_at, \
     messages_sent, messages_received) VALUES ($1, $2, $3, $4, $5) ON CONFLICT (channel_id) DO \
     UPDATE SET last_active_at = CASE WHEN excluded.last_active_at > channel_activity.last_active_at \
     THEN excluded.last_active_at ELSE channel_activity.last_active_at END, \
     messages_sent = channel_activity.messages_sent + excluded.messages_sent, \
     messages_received = channel_activity.messages_received + excluded.messages_received";

/// Writes a batch in one transaction, as multi-row INSERTs ([`super::batch`]).
pub(super) async fn write_batch(pool: &Pool, b: &ObsBatch) -> Result<(), sqlx::Error> {
    on_pool!(pool, |p| {
        let mut tx = p.begin().await?;
        for chunk in batch::chunks(&b.trace) {
            let mut q = sqlx::query(super::dialect::sql(p, INSERT_TRACE.text(chunk.len())));
            for t in chunk {
                q = q
                    .bind(t.ts)
                    .bind(t.seq)
                    .bind(t.kind)
                    .bind(text(&t.session_key))
                    .bind(&t.tenant_id)
                    .bind(&t.chat_id)
                    .bind(&t.message_id)
                    .bind(&t.trace_id)
                    .bind(&t.agent_id)
                    .bind(&t.channel)
                    .bind(&t.tool_name)
                    .bind(t.status)
                    .bind(t.duration_ms)
                    .bind(t.tokens)
                    .bind(t.cost_usd)
                    .bind(i64::from(t.synthetic))
                    .bind(t.finish_reason)
                    .bind(&t.error_kind)
                    .bind(&t.result_digest)
                    .bind(t.result_bytes)
                    .bind(&t.detail)
                    .bind(i64::from(t.fallback));
            }
            q.execute(&mut *tx).await?;
        }
        for chunk in batch::chunks(&b.diag) {
            let mut q = sqlx::query(super::dialect::sql(p, INSERT_DIAG.text(chunk.len())));
            for d in chunk {
                q = q
                    .bind(d.ts)
                    .bind(d.category)
                    .bind(d.kind)
                    .bind(&d.tenant_id)
                    .bind(&d.agent_id)
                    .bind(d.session_key.as_deref().map(text))
                    .bind(&d.channel_id)
                    .bind(&d.data);
            }
            q.execute(&mut *tx).await?;
        }
        for chunk in batch::chunks(&b.prompts) {
            let mut q = sqlx::query(super::dialect::sql(p, INSERT_PROMPT.text(chunk.len())));
            for r in chunk {
                q = q
                    .bind(text(&r.session_key))
                    .bind(&r.agent_id)
                    .bind(&r.run_id)
                    .bind(r.created_at)
                    .bind(&r.report);
            }
            q.execute(&mut *tx).await?;
        }
        for c in b.channels.values() {
            sqlx::query(super::dialect::sql(p, UPSERT_CHANNEL))
                .bind(&c.channel_id)
                .bind(&c.channel_type)
                .bind(c.ts)
                .bind(c.sent)
                .bind(c.received)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await
    })
}

/// Sums of model calls (successful ones in the token and cost figures).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Sums {
    pub calls: i64,
    pub failed_calls: i64,
    pub cache_hits: i64,
    pub input_tokens: i64,
    pub output_tokens: i64,
    pub cached_tokens: i64,
    pub cache_write_tokens: i64,
    pub cost_usd: f64,
    pub cache_saved_usd: f64,
}

impl Sums {
    fn add(&mut self, o: &Sums) {
        self.calls += o.calls;
        self.failed_calls += o.failed_calls;
        self.cache_hits += o.cache_hits;
        self.input_tokens += o.input_tokens;
        self.output_tokens += o.output_tokens;
        self.cached_tokens += o.cached_tokens;
        self.cache_write_tokens += o.cache_write_tokens;
        self.cost_usd += o.cost_usd;
        self.cache_saved_usd += o.cache_saved_usd;
    }

    /// Share of successful calls that read from the prompt cache (0 without calls).
    pub fn hit_rate(&self) -> f64 {
        if self.calls > 0 {
            self.cache_hits as f64 / self.calls as f64
        } else {
            0.0
        }
    }

    /// Successful calls that did not read from the prompt cache.
    pub fn misses(&self) -> i64 {
        self.calls - self.cache_hits
    }

    /// The sums of several groups (providers) together.
    pub fn total<'a>(groups: impl IntoIterator<Item = &'a Sums>) -> Sums {
        let mut t = Sums::default();
        for s in groups {
            t.add(s);
        }
        t
    }

    fn of(r: &impl StoreRow) -> Result<Self, sqlx::Error> {
        Ok(Self {
            calls: r.col::<Option<i64>>("calls")?.unwrap_or(0),
            failed_calls: r.col::<Option<i64>>("failed_calls")?.unwrap_or(0),
            cache_hits: r.col::<Option<i64>>("cache_hits")?.unwrap_or(0),
            input_tokens: r.col::<Option<i64>>("input_tokens")?.unwrap_or(0),
            output_tokens: r.col::<Option<i64>>("output_tokens")?.unwrap_or(0),
            cached_tokens: r.col::<Option<i64>>("cached_tokens")?.unwrap_or(0),
            cache_write_tokens: r.col::<Option<i64>>("cache_write_tokens")?.unwrap_or(0),
            cost_usd: r.col::<Option<f64>>("cost_usd")?.unwrap_or(0.0),
            cache_saved_usd: r.col::<Option<f64>>("cache_saved_usd")?.unwrap_or(0.0),
        })
    }
}

/// Which model calls to sum.
#[derive(Debug, Clone, Copy, Default)]
pub struct UsageWindow<'a> {
    /// Inclusive, epoch ms.
    pub since: Option<i64>,
    /// Exclusive, epoch ms.
    pub until: Option<i64>,
    pub agent: Option<&'a str>,
    pub provider: Option<&'a str>,
}

// The sums of raw rows and of the hourly rollup, per provider; CAST because PostgreSQL sums
// BIGINT as numeric.
macro_rules! sum_raw_columns {
    () => {
        "SELECT provider, \
     CAST(SUM(CASE WHEN ok = 1 THEN 1 ELSE 0 END) AS BIGINT) AS calls, \
     CAST(SUM(CASE WHEN ok = 1 THEN 0 ELSE 1 END) AS BIGINT) AS failed_calls, \
     CAST(SUM(CASE WHEN ok = 1 AND cached_tokens > 0 THEN 1 ELSE 0 END) AS BIGINT) AS cache_hits, \
     CAST(SUM(CASE WHEN ok = 1 THEN input_tokens ELSE 0 END) AS BIGINT) AS input_tokens, \
     CAST(SUM(CASE WHEN ok = 1 THEN output_tokens ELSE 0 END) AS BIGINT) AS output_tokens, \
     CAST(SUM(CASE WHEN ok = 1 THEN cached_tokens ELSE 0 END) AS BIGINT) AS cached_tokens, \
     CAST(SUM(CASE WHEN ok = 1 THEN cache_write_tokens ELSE 0 END) AS BIGINT) AS cache_write_tokens, \
     SUM(CASE WHEN ok = 1 THEN cost_usd ELSE 0.0 END) AS cost_usd, \
     SUM(CASE WHEN ok = 1 THEN cache_saved_usd ELSE 0.0 END) AS cache_saved_usd"
    };
}
const SUM_RAW: &str = concat!(
    sum_raw_columns!(),
    " FROM usage WHERE ts >= $1 AND ts < $2 AND ($3 IS NULL OR agent_id = $3) \
     AND ($4 IS NULL OR provider = $4) GROUP BY provider"
);

/// [`SUM_RAW`]'s sums over one session's rows, by the `usage_by_session` index (a disjunction
/// on the session would make the planner scan the time index instead).
const SUM_SESSION: &str = concat!(
    sum_raw_columns!(),
    " FROM usage WHERE session_key = $1 AND ts >= $2 GROUP BY provider"
);

const SUM_HOURLY: &str = "SELECT provider, CAST(SUM(calls) AS BIGINT) AS calls, \
     CAST(SUM(failed_calls) AS BIGINT) AS failed_calls, CAST(SUM(cache_hits) AS BIGINT) AS cache_hits, \
     CAST(SUM(input_tokens) AS BIGINT) AS input_tokens, CAST(SUM(output_tokens) AS BIGINT) AS output_tokens, \
     CAST(SUM(cached_tokens) AS BIGINT) AS cached_tokens, \
     CAST(SUM(cache_write_tokens) AS BIGINT) AS cache_write_tokens, \
     SUM(cost_usd) AS cost_usd, SUM(cache_saved_usd) AS cache_saved_usd \
     FROM usage_hourly WHERE hour_ms >= $1 AND hour_ms < $2 AND ($3 IS NULL OR agent_id = $3) \
     AND ($4 IS NULL OR provider = $4) GROUP BY provider";

/// The columns of a trace row as the API shows it.
macro_rules! trace_columns {
    () => {
        "id, ts, seq, kind, session_key, chat_id, message_id, trace_id, agent_id, channel, \
         tool_name, status, duration_ms, tokens, cost_usd, synthetic, finish_reason, error_kind, \
         result_digest, result_bytes"
    };
}
const TRACE_COLUMNS: &str = trace_columns!();

fn trace_fact(r: &impl StoreRow) -> Result<TraceFact, sqlx::Error> {
    Ok(TraceFact {
        ts: r.col("ts")?,
        seq: r.col("seq")?,
        kind: r.col("kind")?,
        trace_id: r.col("trace_id")?,
        session_key: r.col("session_key")?,
        agent_id: r.col("agent_id")?,
        tool_name: r.col("tool_name")?,
        status: r.col("status")?,
        duration_ms: r.col("duration_ms")?,
        tokens: r.col("tokens")?,
        cost_usd: r.col("cost_usd")?,
        finish_reason: r.col("finish_reason")?,
        error_kind: r.col("error_kind")?,
        result_digest: r.col("result_digest")?,
        result_bytes: r.col("result_bytes")?,
        synthetic: r.col::<i64>("synthetic")? != 0,
    })
}

/// A trace row with the members only the API shows.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TraceView {
    pub fact: TraceFact,
    pub chat_id: Option<String>,
    pub message_id: Option<String>,
    pub channel: Option<String>,
}

fn trace_view(r: &impl StoreRow) -> Result<TraceView, sqlx::Error> {
    Ok(TraceView {
        fact: trace_fact(r)?,
        chat_id: r.col("chat_id")?,
        message_id: r.col("message_id")?,
        channel: r.col("channel")?,
    })
}

/// What `obs.trace.search` asks.
#[derive(Debug, Default)]
pub struct TraceQuery<'a> {
    pub since: i64,
    pub message_id: Option<&'a str>,
    pub trace_id: Option<&'a str>,
    pub chat_id: Option<&'a str>,
    pub filter: Filter,
    pub include_synthetic: bool,
    pub limit: i64,
}

/// A diagnostic event as read back.
#[derive(Debug, Clone, PartialEq)]
pub struct DiagView {
    pub ts: i64,
    pub category: String,
    pub kind: String,
    pub agent_id: Option<String>,
    pub session_key: Option<String>,
    pub channel_id: Option<String>,
    pub data: String,
}

/// Which diagnostic events to read.
#[derive(Debug, Clone, Copy, Default)]
pub struct DiagQuery<'a> {
    pub category: Option<&'a str>,
    /// Only events of this session.
    pub session_key: Option<&'a str>,
    pub since: i64,
    pub limit: i64,
}

/// A stored session's facts for `obs.explain` (the sessions row).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SessionRowFacts {
    pub agent_id: String,
    pub channel: String,
    pub created_at: i64,
    pub updated_at: i64,
    pub turns: i64,
    pub last_finish_reason: Option<String>,
    pub last_error_kind: Option<String>,
}

/// Rows deleted per table by a reset.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ResetCounts {
    pub token_usage: i64,
    pub delivery: i64,
    pub diagnostics: i64,
    pub channels: i64,
    pub trace_index: i64,
    pub prompt_reports: i64,
}

/// The tables `obs.reset.table` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObsTable {
    TokenUsage,
    Delivery,
    Diagnostics,
    Channels,
    TraceIndex,
    PromptReports,
}

impl ObsTable {
    /// The SQL tables behind it (the gateway has no delivery table yet: nothing is delivered to
    /// chat platforms, so there is nothing to delete).
    fn tables(self) -> &'static [&'static str] {
        match self {
            Self::TokenUsage => &["usage", "usage_hourly"],
            Self::Delivery => &[],
            Self::Diagnostics => &["diagnostics"],
            Self::Channels => &["channel_activity"],
            Self::TraceIndex => &["trace_rows"],
            Self::PromptReports => &["prompt_reports"],
        }
    }
}

/// Rows of the window's tool results and turn ends, for fleet health.
const FLEET_ROWS: &str = concat!(
    "SELECT ",
    trace_columns!(),
    " FROM trace_rows WHERE ts >= $1 AND ts <= $2 AND synthetic = 0 \
     AND kind IN ('turn_end', 'tool_result') ORDER BY ts, id"
);

impl Store {
    /// Sums of the model calls of a window per provider: whole hours from the rollup, the
    /// partial hours at either end from the rows themselves, so the figures are exact.
    pub async fn usage_sums(
        &self,
        w: UsageWindow<'_>,
    ) -> Result<BTreeMap<String, Sums>, GatewayError> {
        self.usage_flush().await?;
        let since = w.since.unwrap_or(i64::MIN);
        let until = w.until.unwrap_or(i64::MAX);
        // Whole hours [lo, hi) come from the rollup.
        let lo = if since == i64::MIN {
            i64::MIN
        } else {
            hour_of(since.saturating_add(HOUR_MS - 1))
        };
        let hi = if until == i64::MAX {
            i64::MAX
        } else {
            hour_of(until)
        };
        let mut parts: Vec<(bool, i64, i64)> = Vec::new();
        if lo < hi {
            parts.push((true, lo, hi));
            if since < lo {
                parts.push((false, since, lo));
            }
            if hi < until {
                parts.push((false, hi, until));
            }
        } else if since < until {
            parts.push((false, since, until));
        }
        let mut out: BTreeMap<String, Sums> = BTreeMap::new();
        for (hourly, from, to) in parts {
            let sql = if hourly { SUM_HOURLY } else { SUM_RAW };
            let rows: Vec<(String, Sums)> = on_pool!(self.pool(), |p| {
                let rows = sqlx::query(sql)
                    .bind(from)
                    .bind(to)
                    .bind(w.agent)
                    .bind(w.provider)
                    .fetch_all(p)
                    .await?;
                let mut v = Vec::with_capacity(rows.len());
                for r in &rows {
                    v.push((r.col("provider")?, Sums::of(r)?));
                }
                v
            });
            for (provider, s) in rows {
                out.entry(provider).or_default().add(&s);
            }
        }
        Ok(out)
    }

    /// Sums of one session's model calls from a time on.
    pub async fn usage_sums_of_session(
        &self,
        session_key: &str,
        since: Option<i64>,
    ) -> Result<Sums, GatewayError> {
        self.usage_flush().await?;
        let rows: Vec<Sums> = on_pool!(self.pool(), |p| {
            let rows = sqlx::query(SUM_SESSION)
                .bind(text(session_key))
                .bind(since.unwrap_or(i64::MIN))
                .fetch_all(p)
                .await?;
            let mut v = Vec::with_capacity(rows.len());
            for r in &rows {
                v.push(Sums::of(r)?);
            }
            v
        });
        Ok(Sums::total(&rows))
    }

    /// Tokens per hour from `from_hour` (epoch ms, an hour start) on.
    pub async fn usage_tokens_by_hour(
        &self,
        from_hour: i64,
    ) -> Result<BTreeMap<i64, i64>, GatewayError> {
        self.usage_flush().await?;
        Ok(on_pool!(self.pool(), |p| {
            let rows = sqlx::query(
                "SELECT hour_ms, CAST(SUM(input_tokens + output_tokens) AS BIGINT) AS tokens \
                 FROM usage_hourly WHERE hour_ms >= $1 GROUP BY hour_ms",
            )
            .bind(from_hour)
            .fetch_all(p)
            .await?;
            let mut out = BTreeMap::new();
            for r in &rows {
                out.insert(
                    r.col::<i64>("hour_ms")?,
                    r.col::<Option<i64>>("tokens")?.unwrap_or(0),
                );
            }
            out
        }))
    }

    /// Queues an observability row.
    pub fn trace_record(&self, row: TraceRow) {
        self.obs_record(ObsRow::Trace(Box::new(row)));
    }

    /// Session index rows matching `q`, newest first.
    pub async fn trace_search(&self, q: &TraceQuery<'_>) -> Result<Vec<TraceView>, GatewayError> {
        self.usage_flush().await?;
        let (fragment, values) = q.filter.to_sql(7);
        let sql = format!(
            "SELECT {TRACE_COLUMNS} FROM trace_rows WHERE ts >= $1 AND ($2 IS NULL OR message_id = $2) \
             AND ($3 IS NULL OR trace_id = $3) AND ($4 IS NULL OR chat_id = $4) \
             AND ($5 = 1 OR synthetic = 0) AND {fragment} \
             ORDER BY ts DESC, id DESC LIMIT $6"
        );
        Ok(on_pool!(self.pool(), |p| {
            let mut query = sqlx::query(&sql)
                .bind(q.since)
                .bind(q.message_id.map(text))
                .bind(q.trace_id.map(text))
                .bind(q.chat_id.map(text))
                .bind(i64::from(q.include_synthetic))
                .bind(q.limit);
            for v in &values {
                query = match v {
                    Value::Text(s) => query.bind(text(s).into_owned()),
                    Value::Int(i) => query.bind(*i),
                    Value::Num(n) => query.bind(*n),
                    Value::Bool(b) => query.bind(i64::from(*b)),
                };
            }
            let rows = query.fetch_all(p).await?;
            let mut out = Vec::with_capacity(rows.len());
            for r in &rows {
                out.push(trace_view(r)?);
            }
            out
        }))
    }

    /// The rows of one chat written after `since`, oldest first.
    pub async fn trace_tail(
        &self,
        chat_id: &str,
        since: i64,
        limit: i64,
    ) -> Result<Vec<TraceView>, GatewayError> {
        self.usage_flush().await?;
        Ok(on_pool!(self.pool(), |p| {
            let rows = sqlx::query(&format!(
                "SELECT {TRACE_COLUMNS} FROM trace_rows WHERE chat_id = $1 AND ts > $2 \
                 ORDER BY ts, id LIMIT $3"
            ))
            .bind(text(chat_id))
            .bind(since)
            .bind(limit)
            .fetch_all(p)
            .await?;
            let mut out = Vec::with_capacity(rows.len());
            for r in &rows {
                out.push(trace_view(r)?);
            }
            out
        }))
    }

    /// Every indexed row of one session, in session order.
    pub async fn trace_of_session(
        &self,
        session_key: &str,
    ) -> Result<(Vec<TraceFact>, Option<String>), GatewayError> {
        self.usage_flush().await?;
        Ok(on_pool!(self.pool(), |p| {
            let rows = sqlx::query(&format!(
                "SELECT {TRACE_COLUMNS}, detail FROM trace_rows WHERE session_key = $1 ORDER BY seq, id"
            ))
            .bind(text(session_key))
            .fetch_all(p)
            .await?;
            let mut out = Vec::with_capacity(rows.len());
            let mut last_detail = None;
            for r in &rows {
                let fact = trace_fact(r)?;
                if fact.kind == "turn_end" {
                    last_detail = r.col::<Option<String>>("detail")?;
                }
                out.push(fact);
            }
            (out, last_detail)
        }))
    }

    /// The session a trace id belongs to.
    pub async fn trace_session_of(&self, trace_id: &str) -> Result<Option<String>, GatewayError> {
        self.usage_flush().await?;
        Ok(on_pool!(self.pool(), |p| {
            sqlx::query_scalar("SELECT session_key FROM trace_rows WHERE trace_id = $1 LIMIT 1")
                .bind(text(trace_id))
                .fetch_optional(p)
                .await?
        }))
    }

    /// The session a (root) run ran in.
    pub async fn run_session_of(&self, root_run_id: &str) -> Result<Option<String>, GatewayError> {
        Ok(on_pool!(self.pool(), |p| {
            sqlx::query_scalar(
                "SELECT session_key FROM runs WHERE root_run_id = $1 OR run_id = $1 \
                 ORDER BY started_at LIMIT 1",
            )
            .bind(text(root_run_id))
            .fetch_optional(p)
            .await?
        }))
    }

    /// The turn ends and tool results of a window (non-synthetic), in time order.
    pub async fn trace_window(&self, start: i64, end: i64) -> Result<Vec<TraceFact>, GatewayError> {
        self.usage_flush().await?;
        Ok(on_pool!(self.pool(), |p| {
            let rows = sqlx::query(FLEET_ROWS)
                .bind(start)
                .bind(end)
                .fetch_all(p)
                .await?;
            let mut out = Vec::with_capacity(rows.len());
            for r in &rows {
                out.push(trace_fact(r)?);
            }
            out
        }))
    }

    /// Turns of the window whose answer came from a model other than the one the turn asked
    /// for first (a fallback served it).
    pub async fn trace_fallback_turns(&self, start: i64, end: i64) -> Result<i64, GatewayError> {
        self.usage_flush().await?;
        Ok(on_pool!(self.pool(), |p| {
            sqlx::query_scalar::<_, i64>(
                "SELECT COUNT(*) FROM trace_rows WHERE ts >= $1 AND ts <= $2 AND kind = 'turn_end' \
                 AND fallback = 1",
            )
            .bind(start)
            .bind(end)
            .fetch_one(p)
            .await?
        }))
    }

    /// Failed model calls of a window per error kind, most frequent first.
    pub async fn usage_failures(
        &self,
        start: i64,
        end: i64,
    ) -> Result<Vec<(String, i64)>, GatewayError> {
        self.usage_flush().await?;
        Ok(on_pool!(self.pool(), |p| {
            let rows = sqlx::query(
                "SELECT COALESCE(error_kind, 'unknown') AS kind, COUNT(*) AS n FROM usage \
                 WHERE ts >= $1 AND ts <= $2 AND ok = 0 GROUP BY COALESCE(error_kind, 'unknown') \
                 ORDER BY n DESC, kind",
            )
            .bind(start)
            .bind(end)
            .fetch_all(p)
            .await?;
            let mut out = Vec::with_capacity(rows.len());
            for r in &rows {
                out.push((r.col("kind")?, r.col("n")?));
            }
            out
        }))
    }

    /// Gated cron fires of a window.
    pub async fn gate_fires(&self, start: i64, end: i64) -> Result<Vec<GateFire>, GatewayError> {
        Ok(on_pool!(self.pool(), |p| {
            let rows = sqlx::query(
                "SELECT agent_id, gate, tool_calls, est_turns_saved FROM cron_runs \
                 WHERE ts >= $1 AND ts <= $2 AND gate IS NOT NULL ORDER BY ts, id",
            )
            .bind(start)
            .bind(end)
            .fetch_all(p)
            .await?;
            let mut out = Vec::with_capacity(rows.len());
            for r in &rows {
                let gate: String = r.col("gate")?;
                let record = serde_json::from_str::<GateRecord>(&gate).unwrap_or_default();
                let (calls_allowed, calls_denied) = record.calls();
                out.push(GateFire {
                    agent_id: r.col("agent_id")?,
                    skipped: record.decision == "skip",
                    failed_open: record.decision == "failed_open",
                    tool_calls: r.col::<Option<i64>>("tool_calls")?.unwrap_or(0),
                    turns_saved: r.col::<Option<i64>>("est_turns_saved")?.unwrap_or(0),
                    calls_allowed,
                    calls_denied,
                });
            }
            out
        }))
    }

    /// The newest `limit` gated fires of one job (of `owner`, run by `agent_id`), newest
    /// first: what `obs.explain` of the job's session reports of its wake gate. A record that
    /// does not parse is left out.
    pub async fn gated_fires_of_job(
        &self,
        job_id: &str,
        owner: &str,
        agent_id: &str,
        limit: i64,
    ) -> Result<Vec<GatedFire>, GatewayError> {
        Ok(on_pool!(self.pool(), |p| {
            let rows = sqlx::query(
                "SELECT gate, tool_calls, est_turns_saved FROM cron_runs \
                 WHERE job_id = $1 AND owner = $2 AND agent_id = $3 AND gate IS NOT NULL \
                 ORDER BY id DESC LIMIT $4",
            )
            .bind(text(job_id))
            .bind(text(owner))
            .bind(text(agent_id))
            .bind(limit)
            .fetch_all(p)
            .await?;
            let mut out = Vec::with_capacity(rows.len());
            for r in &rows {
                let gate: String = r.col("gate")?;
                let Ok(record) = serde_json::from_str::<GateRecord>(&gate) else {
                    continue;
                };
                out.push(GatedFire {
                    job_id: job_id.to_owned(),
                    record,
                    tool_calls: r.col("tool_calls")?,
                    est_turns_saved: r.col("est_turns_saved")?,
                });
            }
            out
        }))
    }

    /// The sessions row `obs.explain` reads.
    pub async fn session_row_facts(
        &self,
        key: &str,
    ) -> Result<Option<SessionRowFacts>, GatewayError> {
        Ok(on_pool!(self.pool(), |p| {
            let row = sqlx::query(
                "SELECT agent_id, channel, created_at, updated_at, turns, last_finish_reason, \
                 last_error_kind FROM sessions WHERE session_key = $1",
            )
            .bind(text(key))
            .fetch_optional(p)
            .await?;
            match row {
                Some(r) => Some(SessionRowFacts {
                    agent_id: r.col("agent_id")?,
                    channel: r.col("channel")?,
                    created_at: r.col("created_at")?,
                    updated_at: r.col("updated_at")?,
                    turns: r.col("turns")?,
                    last_finish_reason: r.col("last_finish_reason")?,
                    last_error_kind: r.col("last_error_kind")?,
                }),
                None => None,
            }
        }))
    }

    /// Every tool result of a session's transcript, digested (no content leaves here).
    pub async fn session_tool_results(
        &self,
        key: &str,
    ) -> Result<Vec<ToolResultFact>, GatewayError> {
        Ok(on_pool!(self.pool(), |p| {
            let rows = sqlx::query(
                "SELECT seq, tool_name, is_error, content FROM messages \
                 WHERE session_key = $1 AND role = 'tool' ORDER BY seq",
            )
            .bind(text(key))
            .fetch_all(p)
            .await?;
            let mut out = Vec::with_capacity(rows.len());
            for r in &rows {
                let content: String = r.col("content")?;
                let is_error = r.col::<Option<i64>>("is_error")?.unwrap_or(0) != 0;
                let tool_name = r
                    .col::<Option<String>>("tool_name")?
                    .unwrap_or_else(|| "unknown".to_owned());
                let recall_hits = (tool_name == "memory_search" && !is_error)
                    .then(|| crate::store::records::recall_hits(&content));
                out.push(ToolResultFact {
                    seq: r.col("seq")?,
                    error_kind: is_error
                        .then(|| crate::store::records::classify_tool_error(&content).to_owned()),
                    digest: crate::store::records::digest(&content),
                    bytes: content.len() as i64,
                    is_error,
                    tool_name,
                    recall_hits,
                });
            }
            out
        }))
    }

    /// Diagnostic events of the caller's reach, newest first, and the counts per category of
    /// the whole window.
    pub async fn diagnostics(
        &self,
        tenant: &Tenant,
        q: DiagQuery<'_>,
    ) -> Result<(Vec<DiagView>, BTreeMap<String, i64>), GatewayError> {
        self.usage_flush().await?;
        Ok(on_pool!(self.pool(), |p| {
            let rows = sqlx::query(
                "SELECT ts, category, type, agent_id, session_key, channel_id, data FROM diagnostics \
                 WHERE ts >= $1 AND ($2 IS NULL OR tenant_id = $2) AND ($3 IS NULL OR category = $3) \
                 AND ($5 IS NULL OR session_key = $5) ORDER BY ts DESC, id DESC LIMIT $4",
            )
            .bind(q.since)
            .bind(tenant.only())
            .bind(q.category)
            .bind(q.limit)
            .bind(q.session_key.map(text))
            .fetch_all(p)
            .await?;
            let mut events = Vec::with_capacity(rows.len());
            for r in &rows {
                events.push(DiagView {
                    ts: r.col("ts")?,
                    category: r.col("category")?,
                    kind: r.col("type")?,
                    agent_id: r.col("agent_id")?,
                    session_key: r.col("session_key")?,
                    channel_id: r.col("channel_id")?,
                    data: r.col("data")?,
                });
            }
            let rows = sqlx::query(
                "SELECT category, COUNT(*) AS n FROM diagnostics WHERE ts >= $1 \
                 AND ($2 IS NULL OR tenant_id = $2) AND ($3 IS NULL OR session_key = $3) \
                 GROUP BY category",
            )
            .bind(q.since)
            .bind(tenant.only())
            .bind(q.session_key.map(text))
            .fetch_all(p)
            .await?;
            let mut counts = BTreeMap::new();
            for r in &rows {
                counts.insert(r.col::<String>("category")?, r.col::<i64>("n")?);
            }
            (events, counts)
        }))
    }

    /// System prompt reports of a session (of one run), newest first.
    pub async fn prompt_reports(
        &self,
        session_key: &str,
        agent_id: Option<&str>,
        run_id: Option<&str>,
        limit: i64,
    ) -> Result<Vec<String>, GatewayError> {
        self.usage_flush().await?;
        Ok(on_pool!(self.pool(), |p| {
            sqlx::query_scalar(
                "SELECT report FROM prompt_reports WHERE session_key = $1 \
                 AND ($2 IS NULL OR agent_id = $2) AND ($3 IS NULL OR run_id = $3) \
                 ORDER BY id DESC LIMIT $4",
            )
            .bind(text(session_key))
            .bind(agent_id)
            .bind(run_id.map(text))
            .bind(limit)
            .fetch_all(p)
            .await?
        }))
    }

    /// Channel activity rows, by channel id.
    pub async fn channel_activity(
        &self,
        channel_id: Option<&str>,
    ) -> Result<Vec<ChannelTouch>, GatewayError> {
        self.usage_flush().await?;
        Ok(on_pool!(self.pool(), |p| {
            let rows = sqlx::query(
                "SELECT channel_id, channel_type, last_active_at, messages_sent, messages_received \
                 FROM channel_activity WHERE ($1 IS NULL OR channel_id = $1) ORDER BY channel_id",
            )
            .bind(channel_id)
            .fetch_all(p)
            .await?;
            let mut out = Vec::with_capacity(rows.len());
            for r in &rows {
                out.push(ChannelTouch {
                    channel_id: r.col("channel_id")?,
                    channel_type: r.col("channel_type")?,
                    ts: r.col("last_active_at")?,
                    sent: r.col("messages_sent")?,
                    received: r.col("messages_received")?,
                });
            }
            out
        }))
    }

    /// Deletes the rows of one observability table; the count deleted.
    pub async fn obs_reset(&self, table: ObsTable) -> Result<i64, GatewayError> {
        self.usage_flush().await?;
        let mut deleted = 0;
        for t in table.tables() {
            // The rollup mirrors the rows: only the rows count.
            let counted = *t != "usage_hourly";
            let n = on_pool!(self.pool(), |p| {
                sqlx::query(&format!("DELETE FROM {t}"))
                    .execute(p)
                    .await?
                    .rows_affected()
            });
            if counted {
                deleted += n as i64;
            }
        }
        Ok(deleted)
    }

    /// Deletes index rows and diagnostics older than their retention, and all but the newest
    /// `keep_reports` prompt reports of each session. The rows deleted.
    pub async fn obs_sweep(
        &self,
        trace_before: i64,
        diagnostics_before: i64,
        keep_reports: i64,
    ) -> Result<u64, GatewayError> {
        Ok(on_pool!(self.pool(), |p| {
            let a = sqlx::query("DELETE FROM trace_rows WHERE ts < $1")
                .bind(trace_before)
                .execute(p)
                .await?
                .rows_affected();
            let b = sqlx::query("DELETE FROM diagnostics WHERE ts < $1")
                .bind(diagnostics_before)
                .execute(p)
                .await?
                .rows_affected();
            let c = sqlx::query(
                "DELETE FROM prompt_reports WHERE id IN (SELECT id FROM (SELECT id, ROW_NUMBER() \
                 OVER (PARTITION BY session_key ORDER BY id DESC) AS rn FROM prompt_reports) ranked \
                 WHERE rn > $1)",
            )
            .bind(keep_reports)
            .execute(p)
            .await?
            .rows_affected();
            a + b + c
        }))
    }
}

/// The shape of one session's transcript (obs.context.dag).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SessionShape {
    pub session_key: String,
    pub agent_id: String,
    pub updated_at: i64,
    pub messages: i64,
    /// Compaction summaries (system messages).
    pub summaries: i64,
    /// Estimated tokens of the transcript (characters / 4).
    pub tokens: i64,
}

impl Store {
    /// The most recently updated sessions (of one agent), with their transcripts' shapes.
    pub async fn session_shapes(
        &self,
        agent_id: Option<&str>,
        limit: i64,
    ) -> Result<Vec<SessionShape>, GatewayError> {
        Ok(on_pool!(self.pool(), |p| {
            let rows = sqlx::query(
                "SELECT s.session_key, s.agent_id, s.updated_at, COUNT(m.id) AS messages, \
                 CAST(COALESCE(SUM(CASE WHEN m.role = 'system' THEN 1 ELSE 0 END), 0) AS BIGINT) AS summaries, \
                 CAST(COALESCE(SUM(LENGTH(m.content)), 0) AS BIGINT) AS chars \
                 FROM (SELECT session_key, agent_id, updated_at FROM sessions \
                       WHERE ($1 IS NULL OR agent_id = $1) ORDER BY updated_at DESC, session_key \
                       LIMIT $2) s \
                 LEFT JOIN messages m ON m.session_key = s.session_key \
                 GROUP BY s.session_key, s.agent_id, s.updated_at \
                 ORDER BY s.updated_at DESC, s.session_key",
            )
            .bind(agent_id)
            .bind(limit)
            .fetch_all(p)
            .await?;
            let mut out = Vec::with_capacity(rows.len());
            for r in &rows {
                let chars: i64 = r.col("chars")?;
                out.push(SessionShape {
                    session_key: r.col("session_key")?,
                    agent_id: r.col("agent_id")?,
                    updated_at: r.col("updated_at")?,
                    messages: r.col("messages")?,
                    summaries: r.col("summaries")?,
                    tokens: (chars + 3) / 4,
                });
            }
            out
        }))
    }

    /// The compactions of a session recorded as diagnostics, newest first.
    pub async fn compactions_of(
        &self,
        session_key: &str,
        limit: i64,
    ) -> Result<Vec<ObsContextDagResultSnapshotsItemCompactionsItem>, GatewayError> {
        self.usage_flush().await?;
        let rows: Vec<(i64, String)> = on_pool!(self.pool(), |p| {
            let rows = sqlx::query(
                "SELECT ts, data FROM diagnostics WHERE session_key = $1 \
                 AND type = 'session.compacted' ORDER BY ts DESC, id DESC LIMIT $2",
            )
            .bind(text(session_key))
            .bind(limit)
            .fetch_all(p)
            .await?;
            let mut out = Vec::with_capacity(rows.len());
            for r in &rows {
                out.push((r.col("ts")?, r.col("data")?));
            }
            out
        });
        Ok(rows
            .into_iter()
            .filter_map(|(at, data)| {
                let v: serde_json::Value = serde_json::from_str(&data).ok()?;
                let n = |k: &str| v.get(k).and_then(serde_json::Value::as_i64);
                Some(ObsContextDagResultSnapshotsItemCompactionsItem {
                    at,
                    depth: n("depth")?.max(1),
                    nodes_compacted: n("nodesCompacted")?.max(1),
                    tokens_before: n("tokensBefore")?,
                    tokens_after: n("tokensAfter")?,
                })
            })
            .collect())
    }
}

/// The usage facts of a session from its sums.
pub fn usage_facts(s: &Sums) -> UsageFacts {
    UsageFacts {
        calls: s.calls,
        failed_calls: s.failed_calls,
        input_tokens: s.input_tokens,
        output_tokens: s.output_tokens,
        cached_tokens: s.cached_tokens,
        cost_usd: s.cost_usd,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::usage::UsageRow;

    /// The sweep deletes index rows and diagnostics past their retention and all but the newest
    /// prompt reports of each session; the limit of the obs queue drops rows, never usage.
    #[tokio::test]
    async fn sweeps_keep_what_retention_keeps() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("t.db")).await.unwrap();
        for ts in [10, 20, 30] {
            store.trace_record(TraceRow {
                ts,
                kind: "turn_end",
                session_key: "k".into(),
                trace_id: format!("t{ts}"),
                ..TraceRow::default()
            });
            store.obs_record(ObsRow::Diag(DiagRow {
                ts,
                category: "message",
                kind: "message.completed",
                data: "{}".into(),
                ..DiagRow::default()
            }));
        }
        for (key, n) in [("a", 5), ("b", 2)] {
            for i in 0..n {
                store.obs_record(ObsRow::Prompt(PromptRow {
                    session_key: key.into(),
                    agent_id: "x".into(),
                    run_id: Some(format!("r{i}")),
                    created_at: i,
                    report: "{}".into(),
                }));
            }
        }
        store.usage_flush().await.unwrap();
        // Index rows before 25, diagnostics before 15, reports beyond 3 per session.
        assert_eq!(store.obs_sweep(25, 15, 3).await.unwrap(), 2 + 1 + 2);
        let rows = store
            .trace_search(&TraceQuery {
                limit: 10,
                ..TraceQuery::default()
            })
            .await
            .unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].fact.ts, 30);
        let admin = Tenant::for_principal("", true);
        let all = DiagQuery {
            limit: 10,
            ..DiagQuery::default()
        };
        let (events, counts) = store.diagnostics(&admin, all).await.unwrap();
        assert_eq!(events.len(), 2);
        assert_eq!(counts["message"], 2);
        let a = store.prompt_reports("a", None, None, 10).await.unwrap();
        assert_eq!(a.len(), 3);
        assert_eq!(
            store
                .prompt_reports("b", None, None, 10)
                .await
                .unwrap()
                .len(),
            2
        );
        // The newest are the ones kept.
        let newest = store
            .prompt_reports("a", None, Some("r4"), 10)
            .await
            .unwrap();
        assert_eq!(newest.len(), 1);
        let oldest = store
            .prompt_reports("a", None, Some("r0"), 10)
            .await
            .unwrap();
        assert!(oldest.is_empty());
    }

    /// Windows cut anywhere (inside an hour, on hour starts, across many hours) sum exactly the
    /// rows inside them, whichever part comes from the rollup and which from the rows.
    #[tokio::test]
    async fn window_sums_equal_the_sums_of_the_rows_inside() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("t.db")).await.unwrap();
        let base = 1_800_000_000_000_i64 - 1_800_000_000_000 % HOUR_MS;
        let mut rows = Vec::new();
        // 400 calls over ~10 hours, two agents and providers, some failed, some cached.
        for i in 0..400_i64 {
            let row = UsageRow {
                ts: base + i * 97_531,
                agent_id: if i % 3 == 0 { "a" } else { "b" }.into(),
                provider: if i % 5 == 0 { "p" } else { "q" }.into(),
                model: "p/m".into(),
                operation: "chat".into(),
                input_tokens: 10 + i,
                output_tokens: i % 7,
                cached_tokens: if i % 4 == 0 { 5 } else { 0 },
                cost_usd: (i as f64) * 1e-6,
                cache_saved_usd: if i % 4 == 0 { 1e-7 } else { 0.0 },
                ok: i % 11 != 0,
                ..UsageRow::default()
            };
            store.usage_record(row.clone()).unwrap();
            rows.push(row);
        }
        store.usage_flush().await.unwrap();
        let last = rows.last().unwrap().ts;
        let cuts = [
            None,
            Some(base),
            Some(base + 1),
            Some(base + HOUR_MS - 1),
            Some(base + HOUR_MS),
            Some(base + 3 * HOUR_MS + 12_345),
            Some(last),
            Some(last + 1),
        ];
        for since in cuts {
            for until in cuts {
                for agent in [None, Some("a")] {
                    let got = store
                        .usage_sums(UsageWindow {
                            since,
                            until,
                            agent,
                            provider: None,
                        })
                        .await
                        .unwrap();
                    let inside: Vec<&UsageRow> = rows
                        .iter()
                        .filter(|r| since.is_none_or(|s| r.ts >= s))
                        .filter(|r| until.is_none_or(|u| r.ts < u))
                        .filter(|r| agent.is_none_or(|a| r.agent_id == a))
                        .collect();
                    let mut want = Sums::default();
                    for r in &inside {
                        if r.ok {
                            want.calls += 1;
                            want.input_tokens += r.input_tokens;
                            want.output_tokens += r.output_tokens;
                            want.cached_tokens += r.cached_tokens;
                            want.cache_hits += i64::from(r.cached_tokens > 0);
                            want.cost_usd += r.cost_usd;
                        } else {
                            want.failed_calls += 1;
                        }
                    }
                    let t = Sums::total(got.values());
                    let what = format!("since {since:?} until {until:?} agent {agent:?}");
                    assert_eq!(t.calls, want.calls, "{what}");
                    assert_eq!(t.failed_calls, want.failed_calls, "{what}");
                    assert_eq!(t.cache_hits, want.cache_hits, "{what}");
                    assert_eq!(t.input_tokens, want.input_tokens, "{what}");
                    assert_eq!(t.output_tokens, want.output_tokens, "{what}");
                    assert_eq!(t.cached_tokens, want.cached_tokens, "{what}");
                    assert!((t.cost_usd - want.cost_usd).abs() < 1e-9, "{what}");
                }
            }
        }
        // One session's sums come from its rows.
        let by_hour = store.usage_tokens_by_hour(base).await.unwrap();
        let tokens: i64 = rows
            .iter()
            .filter(|r| r.ok)
            .map(|r| r.input_tokens + r.output_tokens)
            .sum();
        assert_eq!(by_hour.values().sum::<i64>(), tokens);
    }
}
