//! Moving a whole store between backends (`agent-gateway export` / `import`), and the state of a
//! database's migrations (`agent-gateway migrate --check`).
//!
//! The dump is NDJSON: a header line, one line per row (`{"t":table,"r":{column:value,…}}`,
//! every column by name in declared order, values as stored), and a trailer with each table's
//! row count and the SHA-256 of its row lines. Tables go in foreign-key order, each sorted by a
//! key both backends order alike (byte order: PostgreSQL's key columns are `COLLATE "C"`).
//!
//! The digest is over a canonical form both backends produce identically: the row line written
//! from typed values (i64 as an integer, f64 by its shortest round-trip form, text as a JSON
//! string) with U+0000 already replaced by U+FFFD ([`super::text`], which import applies too).
//! So an import is verified by re-reading the target in export order and comparing counts and
//! digests with the trailer.

use std::io::{BufRead, Write};
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use futures_util::TryStreamExt;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use sqlx::Connection;

use super::{now_ms, on_pool, schema_version, text, Pool, Store, StoreRow};
use crate::config::store::{without_password, Backend};

/// The `format` of the header line.
pub const FORMAT: &str = "agent-gateway-store";
/// The version of the dump format (not of the schema).
pub const FORMAT_VERSION: i64 = 1;

/// Rows per import transaction.
const BATCH_ROWS: usize = 1000;
/// Rows per INSERT statement within a transaction. SQLite looks `$N` parameters up by a linear
/// walk of the statement's parameter list (when sqlx binds, and when SQLite parses), so one
/// statement of 1,000 rows × 13 columns cost quadratic time: 200,000 rows took 138 s to import
/// in a debug build. 64 rows × 20 columns at most is 1,280 parameters.
const CHUNK_ROWS: usize = 64;
/// A batch is also committed once its text reaches this size, so long transcripts do not make
/// one huge statement.
const BATCH_BYTES: usize = 16 << 20;

/// What a failed transfer reports (printed to stderr by the command).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransferError(pub String);

impl std::fmt::Display for TransferError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TransferError {}

impl From<sqlx::Error> for TransferError {
    fn from(e: sqlx::Error) -> Self {
        Self(format!("database: {e}"))
    }
}

impl From<std::io::Error> for TransferError {
    fn from(e: std::io::Error) -> Self {
        Self(format!("i/o: {e}"))
    }
}

fn fail<T>(msg: impl Into<String>) -> Result<T, TransferError> {
    Err(TransferError(msg.into()))
}

/// How a column's values are decoded and bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Int,
    Real,
    Text,
}

/// One column of an exported table.
#[derive(Debug)]
struct Col {
    name: &'static str,
    kind: Kind,
    nullable: bool,
}

const fn col(name: &'static str, kind: Kind, nullable: bool) -> Col {
    Col {
        name,
        kind,
        nullable,
    }
}
const fn int(name: &'static str) -> Col {
    col(name, Kind::Int, false)
}
const fn int_n(name: &'static str) -> Col {
    col(name, Kind::Int, true)
}
const fn real(name: &'static str) -> Col {
    col(name, Kind::Real, false)
}
const fn real_n(name: &'static str) -> Col {
    col(name, Kind::Real, true)
}
const fn txt(name: &'static str) -> Col {
    col(name, Kind::Text, false)
}
const fn txt_n(name: &'static str) -> Col {
    col(name, Kind::Text, true)
}

/// One exported table: its columns in declared order (schema version 8; PostgreSQL's
/// generated `content_tsv` is left out), the order its rows are written in, and whether its
/// `id` is an identity whose sequence import must move past the imported ids.
#[derive(Debug)]
pub struct Table {
    pub name: &'static str,
    cols: &'static [Col],
    order_by: &'static str,
    identity: bool,
}

/// Every exported table, parents before children. `nodes`, `leases`, `fanout` and
/// `run_steering` are state of a running fleet and are not exported.
pub const TABLES: &[Table] = &[
    Table {
        name: "providers",
        cols: &[
            txt("id"),
            txt("kind"),
            txt("config"),
            txt_n("seed_hash"),
            int("created_at"),
            int("updated_at"),
        ],
        order_by: "id",
        identity: false,
    },
    Table {
        name: "agents",
        cols: &[
            txt("id"),
            txt("config"),
            int("suspended"),
            txt_n("seed_hash"),
            int("created_at"),
            int("updated_at"),
        ],
        order_by: "id",
        identity: false,
    },
    Table {
        name: "sessions",
        cols: &[
            txt("session_key"),
            txt("agent_id"),
            txt("channel"),
            txt_n("tenant_id"),
            txt_n("user_id"),
            txt_n("label"),
            txt("metadata"),
            int("next_seq"),
            int("input_tokens"),
            int("output_tokens"),
            real("cost_usd"),
            int("last_steps"),
            txt_n("last_model"),
            int("created_at"),
            int("updated_at"),
            int("turns"),
            txt_n("last_finish_reason"),
            txt_n("last_error_kind"),
        ],
        order_by: "session_key",
        identity: false,
    },
    Table {
        name: "messages",
        cols: &[
            int("id"),
            txt("session_key"),
            int("seq"),
            txt("role"),
            txt("content"),
            txt_n("tool_calls"),
            txt_n("tool_call_id"),
            txt_n("tool_name"),
            int_n("is_error"),
            txt_n("model"),
            int_n("input_tokens"),
            int_n("output_tokens"),
            int("created_at"),
        ],
        order_by: "session_key, seq",
        identity: true,
    },
    Table {
        name: "session_notes",
        cols: &[
            int("id"),
            txt("session_key"),
            txt("note"),
            int("created_at"),
        ],
        order_by: "id",
        identity: true,
    },
    Table {
        name: "memories",
        cols: &[
            int("id"),
            txt("agent_id"),
            txt_n("session_key"),
            txt("content"),
            txt("tags"),
            int("created_at"),
            txt_n("tenant_id"),
            txt("memory_type"),
            txt("trust_level"),
            int("pinned"),
            int("updated_at"),
            int_n("consolidated_at"),
        ],
        order_by: "id",
        identity: true,
    },
    // Embeddings are not carried: the importing gateway embeds the entries again in the
    // background (with whatever model it runs).
    Table {
        name: "memory_entities",
        cols: &[
            int("id"),
            txt("tenant_id"),
            txt("agent_id"),
            txt("name"),
            txt("norm"),
            int("first_seen"),
            int("last_seen"),
        ],
        order_by: "id",
        identity: true,
    },
    Table {
        name: "memory_entity_mentions",
        cols: &[int("entity_id"), int("memory_id")],
        order_by: "entity_id, memory_id",
        identity: false,
    },
    Table {
        name: "memory_observations",
        cols: &[
            int("id"),
            txt("tenant_id"),
            txt("agent_id"),
            txt("content"),
            real("confidence"),
            int("created_at"),
            int("consolidated_at"),
        ],
        order_by: "id",
        identity: true,
    },
    Table {
        name: "memory_observation_sources",
        cols: &[
            int("observation_id"),
            int("memory_id"),
            txt_n("session_key"),
        ],
        order_by: "observation_id, memory_id",
        identity: false,
    },
    Table {
        name: "context_summaries",
        cols: &[
            txt("id"),
            txt("session_key"),
            txt("kind"),
            int("depth"),
            txt("content"),
            int("token_count"),
            int("first_seq"),
            int("last_seq"),
            int("message_count"),
            txt("taint"),
            txt_n("parent_id"),
            int("created_at"),
        ],
        order_by: "id",
        identity: false,
    },
    Table {
        name: "runs",
        cols: &[
            txt("run_id"),
            txt("root_run_id"),
            txt_n("parent_run_id"),
            txt("agent_id"),
            txt("session_key"),
            txt("task"),
            txt("status"),
            int("depth"),
            txt("client_id"),
            int("started_at"),
            int_n("completed_at"),
            txt_n("response"),
            int_n("input_tokens"),
            int_n("output_tokens"),
            real_n("cost_usd"),
            txt_n("finish_reason"),
            txt_n("error"),
            txt_n("delivery"),
            txt_n("resume"),
            txt_n("claimed_by"),
            txt_n("stop_requested"),
        ],
        order_by: "run_id",
        identity: false,
    },
    Table {
        name: "usage",
        cols: &[
            int("id"),
            int("ts"),
            txt("agent_id"),
            txt_n("session_key"),
            txt("provider"),
            txt("model"),
            txt("operation"),
            int("input_tokens"),
            int("output_tokens"),
            int("cached_tokens"),
            real("cost_usd"),
            int("latency_ms"),
            int("ok"),
            txt_n("error_kind"),
            int("cache_write_tokens"),
            real("cache_saved_usd"),
        ],
        order_by: "id",
        identity: true,
    },
    Table {
        name: "usage_hourly",
        cols: &[
            int("hour_ms"),
            txt("agent_id"),
            txt("provider"),
            txt("model"),
            int("calls"),
            int("failed_calls"),
            int("cache_hits"),
            int("input_tokens"),
            int("output_tokens"),
            int("cached_tokens"),
            int("cache_write_tokens"),
            real("cost_usd"),
            real("cache_saved_usd"),
        ],
        order_by: "hour_ms, agent_id, provider, model",
        identity: false,
    },
    Table {
        name: "webhook_deliveries",
        cols: &[txt("delivery"), int("expires_at")],
        order_by: "delivery",
        identity: false,
    },
    Table {
        name: "cron_jobs",
        cols: &[
            txt("job_id"),
            txt("owner"),
            txt("name"),
            txt("agent_id"),
            txt("message"),
            txt("kind"),
            txt("schedule"),
            int("anchor_at"),
            int("enabled"),
            txt_n("wake_gate"),
            int_n("next_due_at"),
            int("fire_seq"),
            int_n("running_since"),
            txt_n("running_node"),
            int_n("last_run_at"),
            txt_n("last_status"),
            txt_n("last_error"),
            txt_n("seed_hash"),
            int("created_at"),
            int("updated_at"),
        ],
        order_by: "job_id",
        identity: false,
    },
    Table {
        name: "cron_runs",
        cols: &[
            int("id"),
            txt("job_id"),
            txt("owner"),
            txt("job_name"),
            txt("agent_id"),
            int("due_at"),
            int("ts"),
            txt("fire_trigger"),
            txt("status"),
            int_n("duration_ms"),
            txt_n("summary"),
            txt_n("error"),
            int_n("tool_calls"),
            int_n("est_turns_saved"),
            txt_n("root_run_id"),
            txt_n("gate"),
            txt("node"),
        ],
        order_by: "id",
        identity: true,
    },
    Table {
        name: "heartbeat_state",
        cols: &[
            txt("agent_id"),
            int_n("next_due_at"),
            int_n("wake_at"),
            txt_n("wake_sources"),
            int("bypass_backoff"),
            int_n("running_since"),
            txt_n("running_node"),
            int("tick_seq"),
            int_n("last_run_at"),
            int("consecutive_errors"),
            int_n("backoff_until"),
            int_n("last_alert_at"),
            txt_n("last_error_kind"),
            txt_n("last_error"),
            int("updated_at"),
        ],
        order_by: "agent_id",
        identity: false,
    },
    Table {
        name: "heartbeat_events",
        cols: &[
            int("id"),
            txt("agent_id"),
            txt("source"),
            txt("text"),
            int("created_at"),
        ],
        order_by: "id",
        identity: true,
    },
    Table {
        name: "approvals",
        cols: &[
            txt("id"),
            txt("session_key"),
            txt("agent_id"),
            txt("tool_name"),
            txt("summary"),
            txt("args_digest"),
            txt("owner"),
            txt_n("run_id"),
            int("created_at"),
            int("expires_at"),
            txt("status"),
            txt_n("decided_by"),
            txt_n("reason"),
            int_n("decided_at"),
        ],
        order_by: "id",
        identity: false,
    },
    Table {
        name: "approval_denials",
        cols: &[
            txt("session_key"),
            txt("tool_name"),
            txt("args_digest"),
            txt_n("reason"),
            int("created_at"),
        ],
        order_by: "session_key, tool_name, args_digest",
        identity: false,
    },
    Table {
        name: "graphs",
        cols: &[
            txt("owner"),
            txt("id"),
            txt("label"),
            txt_n("agent_id"),
            txt("definition"),
            int("node_count"),
            int("created_at"),
            int("updated_at"),
        ],
        order_by: "owner, id",
        identity: false,
    },
    // Like runs: the holder and the cancel request go with the row (a restored run whose
    // holder is not alive is ended by the orphan sweep).
    Table {
        name: "graph_runs",
        cols: &[
            txt("run_id"),
            txt("owner"),
            txt_n("definition_id"),
            txt_n("label"),
            txt("status"),
            int("node_count"),
            int("completed_nodes"),
            int("failed_nodes"),
            int("artifact_count"),
            int("created_at"),
            int_n("started_at"),
            int_n("completed_at"),
            txt_n("error"),
            txt("nodes"),
            txt_n("claimed_by"),
            int("cancel_requested"),
        ],
        order_by: "run_id",
        identity: false,
    },
    Table {
        name: "api_tokens",
        cols: &[
            txt("id"),
            txt_n("digest"),
            txt("scopes"),
            int("created_at"),
            int_n("expires_at"),
            int_n("last_used_at"),
            int_n("revoked_at"),
        ],
        order_by: "id",
        identity: false,
    },
    Table {
        name: "secrets",
        cols: &[
            txt("name"),
            txt("nonce"),
            txt("ciphertext"),
            txt_n("provider"),
            txt_n("description"),
            int_n("expires_at"),
            int("created_at"),
            int("updated_at"),
        ],
        order_by: "name",
        identity: false,
    },
    Table {
        name: "auth_profiles",
        cols: &[
            txt("profile_id"),
            txt("provider"),
            txt("nonce"),
            txt("ciphertext"),
            int("expires"),
            txt_n("account_id"),
            txt_n("email"),
            txt_n("display_name"),
            int("created_at"),
            int("updated_at"),
        ],
        order_by: "profile_id",
        identity: false,
    },
    Table {
        name: "config_versions",
        cols: &[
            int("id"),
            txt("sha"),
            txt_n("parent"),
            txt("message"),
            txt_n("author"),
            txt_n("section"),
            txt_n("key"),
            txt("document"),
            int("created_at"),
        ],
        order_by: "id",
        identity: true,
    },
    Table {
        name: "config_document",
        cols: &[
            int("id"),
            txt("document"),
            txt_n("head_sha"),
            int("updated_at"),
        ],
        order_by: "id",
        identity: false,
    },
    Table {
        name: "config_files_seen",
        cols: &[txt("digest"), txt("document"), int("seen_at")],
        order_by: "digest",
        identity: false,
    },
    Table {
        name: "config_audit",
        cols: &[
            int("id"),
            int("ts"),
            int("pid"),
            txt("origin"),
            txt_n("method"),
            txt_n("client_id"),
            txt("paths"),
            txt_n("commit_sha"),
            int("suspicious"),
            txt("reasons"),
        ],
        order_by: "id",
        identity: true,
    },
    Table {
        name: "trace_rows",
        cols: &[
            int("id"),
            int("ts"),
            int("seq"),
            txt("kind"),
            txt("session_key"),
            txt_n("tenant_id"),
            txt_n("chat_id"),
            txt_n("message_id"),
            txt("trace_id"),
            txt_n("agent_id"),
            txt_n("channel"),
            txt_n("tool_name"),
            txt_n("status"),
            int_n("duration_ms"),
            int_n("tokens"),
            real_n("cost_usd"),
            int("synthetic"),
            txt_n("finish_reason"),
            txt_n("error_kind"),
            txt_n("result_digest"),
            int_n("result_bytes"),
            txt_n("detail"),
            int("fallback"),
        ],
        order_by: "id",
        identity: true,
    },
    Table {
        name: "diagnostics",
        cols: &[
            int("id"),
            int("ts"),
            txt("category"),
            txt("type"),
            txt_n("tenant_id"),
            txt_n("agent_id"),
            txt_n("session_key"),
            txt_n("channel_id"),
            txt("data"),
        ],
        order_by: "id",
        identity: true,
    },
    Table {
        name: "prompt_reports",
        cols: &[
            int("id"),
            txt("session_key"),
            txt("agent_id"),
            txt_n("run_id"),
            int("created_at"),
            txt("report"),
        ],
        order_by: "id",
        identity: true,
    },
    Table {
        name: "channel_activity",
        cols: &[
            txt("channel_id"),
            txt("channel_type"),
            int("last_active_at"),
            int("messages_sent"),
            int("messages_received"),
        ],
        order_by: "channel_id",
        identity: false,
    },
];

/// One value as stored.
#[derive(Debug, Clone, PartialEq)]
enum Val {
    Null,
    Int(i64),
    Real(f64),
    Text(String),
}

/// Row count and digest of one table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableSum {
    pub table: &'static str,
    pub rows: u64,
    /// Hex SHA-256 over the table's canonical row lines, each followed by `\n`.
    pub digest: String,
}

/// Counts and digests of every exported table, in export order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    pub tables: Vec<TableSum>,
}

impl Summary {
    pub fn total_rows(&self) -> u64 {
        self.tables.iter().map(|t| t.rows).sum()
    }

    fn trailer(&self) -> String {
        let mut counts = Map::new();
        let mut digest = Map::new();
        for t in &self.tables {
            counts.insert(t.table.into(), Value::from(t.rows));
            digest.insert(t.table.into(), Value::from(t.digest.clone()));
        }
        serde_json::json!({"end": true, "counts": counts, "digest": digest}).to_string()
    }
}

/// A table's running count and digest.
struct Tally {
    rows: u64,
    hash: Sha256,
}

impl Tally {
    fn new() -> Self {
        Self {
            rows: 0,
            hash: Sha256::new(),
        }
    }

    fn add(&mut self, canonical_line: &str) {
        self.rows += 1;
        self.hash.update(canonical_line.as_bytes());
        self.hash.update(b"\n");
    }

    fn finish(self, table: &'static str) -> TableSum {
        TableSum {
            table,
            rows: self.rows,
            digest: hex::encode(self.hash.finalize()),
        }
    }
}

/// Writes the row line of `vals` into `out`; `canonical` applies the U+0000 replacement.
fn row_line(
    out: &mut String,
    t: &Table,
    vals: &[Val],
    canonical: bool,
) -> Result<(), TransferError> {
    out.clear();
    out.push_str("{\"t\":\"");
    out.push_str(t.name);
    out.push_str("\",\"r\":{");
    for (i, (c, v)) in t.cols.iter().zip(vals).enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push('"');
        out.push_str(c.name);
        out.push_str("\":");
        match v {
            Val::Null => out.push_str("null"),
            Val::Int(n) => out.push_str(&n.to_string()),
            Val::Real(f) => match serde_json::Number::from_f64(*f) {
                Some(n) => out.push_str(&n.to_string()),
                None => {
                    return fail(format!(
                        "{}.{}: the value {f} is not a finite number and cannot be exported",
                        t.name, c.name
                    ))
                }
            },
            Val::Text(s) => {
                let s = if canonical { text(s) } else { s.into() };
                let quoted = serde_json::to_string(s.as_ref())
                    .map_err(|e| TransferError(format!("{}.{}: {e}", t.name, c.name)))?;
                out.push_str(&quoted);
            }
        }
    }
    out.push_str("}}");
    Ok(())
}

fn has_nul(vals: &[Val]) -> bool {
    vals.iter()
        .any(|v| matches!(v, Val::Text(s) if s.contains('\0')))
}

/// A stored row decoded by the declared column types.
fn read_row(r: &impl StoreRow, t: &Table) -> Result<Vec<Val>, TransferError> {
    let bad = |c: &Col, e: sqlx::Error| {
        TransferError(format!(
            "{}.{}: stored value is not {:?}: {e}",
            t.name, c.name, c.kind
        ))
    };
    t.cols
        .iter()
        .map(|c| {
            let v = match c.kind {
                Kind::Int => r
                    .col::<Option<i64>>(c.name)
                    .map_err(|e| bad(c, e))?
                    .map(Val::Int),
                // SQLite may hand back an integer stored in a REAL column (a value written
                // before the column had its affinity, or by hand): the number is the same.
                Kind::Real => match r.col::<Option<f64>>(c.name) {
                    Ok(v) => v.map(Val::Real),
                    Err(e) => r
                        .col::<Option<i64>>(c.name)
                        .map_err(|_| bad(c, e))?
                        .map(|n| Val::Real(n as f64)),
                },
                Kind::Text => r
                    .col::<Option<String>>(c.name)
                    .map_err(|e| bad(c, e))?
                    .map(Val::Text),
            };
            Ok(v.unwrap_or(Val::Null))
        })
        .collect()
}

/// Reads every exported table in export order; `each` gets every row line as stored. Returns
/// the counts and canonical digests.
async fn scan(
    store: &Store,
    mut each: impl FnMut(&str) -> Result<(), TransferError>,
) -> Result<Summary, TransferError> {
    let mut tables = Vec::with_capacity(TABLES.len());
    let mut line = String::new();
    let mut canonical = String::new();
    for t in TABLES {
        let cols: Vec<&str> = t.cols.iter().map(|c| c.name).collect();
        let sql = format!(
            "SELECT {} FROM {} ORDER BY {}",
            cols.join(", "),
            t.name,
            t.order_by
        );
        let mut tally = Tally::new();
        on_pool!(store.pool(), |p| {
            let mut rows = sqlx::query(&sql).fetch(p);
            while let Some(row) = rows.try_next().await? {
                let vals = read_row(&row, t)?;
                row_line(&mut line, t, &vals, false)?;
                each(&line)?;
                if has_nul(&vals) {
                    row_line(&mut canonical, t, &vals, true)?;
                    tally.add(&canonical);
                } else {
                    tally.add(&line);
                }
            }
        });
        tables.push(tally.finish(t.name));
    }
    Ok(Summary { tables })
}

/// Counts and digests of the store as it is (what `import` compares with the trailer).
pub async fn summarize(store: &Store) -> Result<Summary, TransferError> {
    scan(store, |_| Ok(())).await
}

/// Writes the whole store to `out` as NDJSON (header, rows, trailer), streaming table by
/// table; returns what the trailer says.
pub async fn export(store: &Store, out: &mut impl Write) -> Result<Summary, TransferError> {
    let header = serde_json::json!({
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "schema": schema_version(),
        "source": store.backend_name(),
        "exportedAt": now_ms(),
    });
    writeln!(out, "{header}")?;
    let summary = scan(store, |line| {
        out.write_all(line.as_bytes())?;
        out.write_all(b"\n")?;
        Ok(())
    })
    .await?;
    writeln!(out, "{}", summary.trailer())?;
    out.flush()?;
    Ok(summary)
}

/// What an import did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportReport {
    /// Rows inserted per table (zero everywhere with `verify_only`).
    pub inserted: Vec<(&'static str, u64)>,
    /// U+0000 characters replaced by U+FFFD in the input's text values.
    pub nul_replaced: u64,
    /// The target's counts and digests, equal to the trailer's.
    pub verified: Summary,
}

/// The trailer line.
#[derive(serde::Deserialize)]
struct Trailer {
    counts: Map<String, Value>,
    digest: Map<String, Value>,
}

/// Refuses a header of another format, format version or schema version.
fn check_header(line: &str) -> Result<(), TransferError> {
    let v: Value = serde_json::from_str(line)
        .map_err(|e| TransferError(format!("line 1: not a JSON header: {e}")))?;
    if v["format"].as_str() != Some(FORMAT) {
        return fail(format!(
            "line 1: not an agent-gateway export (format {}, expected \"{FORMAT}\")",
            v["format"]
        ));
    }
    if v["version"].as_i64() != Some(FORMAT_VERSION) {
        return fail(format!(
            "line 1: export format version {} is not supported (this build reads version \
             {FORMAT_VERSION})",
            v["version"]
        ));
    }
    let ours = schema_version();
    match v["schema"].as_i64() {
        Some(s) if s == ours => Ok(()),
        Some(s) if s < ours => fail(format!(
            "line 1: the export is of schema version {s} and this build is at version {ours}: \
             migrate first (run `agent-gateway migrate` with this build on the source database), \
             then export again"
        )),
        Some(s) => fail(format!(
            "line 1: the export is of schema version {s}, newer than this build's {ours}: \
             import it with the build that made it, or migrate the target first with that build"
        )),
        None => fail("line 1: the header has no schema version"),
    }
}

/// Refuses a target that already holds sessions, agents or providers.
async fn ensure_empty(store: &Store) -> Result<(), TransferError> {
    for table in ["providers", "agents", "sessions"] {
        let sql = format!("SELECT COUNT(*) AS n FROM {table}");
        let n: i64 = on_pool!(store.pool(), |p| sqlx::query_scalar(&sql)
            .fetch_one(p)
            .await?);
        if n > 0 {
            return fail(format!(
                "the target database is not empty ({table} has {n} rows): import needs a \
                 database no gateway has served yet"
            ));
        }
    }
    Ok(())
}

/// Decodes one input row by the declared column types; replaces U+0000 in text (counted in
/// `nul`).
fn parse_row(
    t: &Table,
    r: &Map<String, Value>,
    at: usize,
    nul: &mut u64,
) -> Result<Vec<Val>, TransferError> {
    if let Some(extra) = r.keys().find(|k| !t.cols.iter().any(|c| c.name == *k)) {
        return fail(format!(
            "line {at}: {} has no column '{extra}' in schema version {}",
            t.name,
            schema_version()
        ));
    }
    t.cols
        .iter()
        .map(|c| {
            let Some(v) = r.get(c.name) else {
                return fail(format!("line {at}: {}.{} is missing", t.name, c.name));
            };
            let wrong = || {
                fail(format!(
                    "line {at}: {}.{} must be {}, got {v}",
                    t.name,
                    c.name,
                    match (c.kind, c.nullable) {
                        (Kind::Int, false) => "an integer",
                        (Kind::Int, true) => "an integer or null",
                        (Kind::Real, false) => "a number",
                        (Kind::Real, true) => "a number or null",
                        (Kind::Text, false) => "a string",
                        (Kind::Text, true) => "a string or null",
                    }
                ))
            };
            match (c.kind, v) {
                (_, Value::Null) if c.nullable => Ok(Val::Null),
                (Kind::Int, Value::Number(n)) => n.as_i64().map(Val::Int).map_or_else(wrong, Ok),
                (Kind::Real, Value::Number(n)) => n.as_f64().map(Val::Real).map_or_else(wrong, Ok),
                (Kind::Text, Value::String(s)) => {
                    let replaced = s.matches('\0').count() as u64;
                    *nul += replaced;
                    Ok(Val::Text(if replaced > 0 {
                        text(s).into_owned()
                    } else {
                        s.clone()
                    }))
                }
                _ => wrong(),
            }
        })
        .collect()
}

/// Inserts `rows` of `t` (input lines `span`) in one transaction, keeping every value (ids
/// included); an error names the table and the lines.
async fn insert_batch(
    store: &Store,
    t: &Table,
    rows: &[Vec<Val>],
    span: (usize, usize),
) -> Result<(), TransferError> {
    if rows.is_empty() {
        return Ok(());
    }
    insert_rows(store, t, rows).await.map_err(|e| {
        TransferError(format!(
            "lines {}-{} ({}): {e}; the batches before were imported",
            span.0, span.1, t.name
        ))
    })
}

/// The INSERT of `rows` rows into `t`.
fn insert_sql(t: &Table, rows: usize) -> String {
    let n = t.cols.len();
    let cols: Vec<&str> = t.cols.iter().map(|c| c.name).collect();
    let tuples: Vec<String> = (0..rows)
        .map(|r| {
            let params: Vec<String> = (1..=n).map(|c| format!("${}", r * n + c)).collect();
            format!("({})", params.join(","))
        })
        .collect();
    format!(
        "INSERT INTO {} ({}) VALUES {}",
        t.name,
        cols.join(", "),
        tuples.join(",")
    )
}

async fn insert_rows(store: &Store, t: &Table, rows: &[Vec<Val>]) -> Result<(), TransferError> {
    let full = insert_sql(t, CHUNK_ROWS);
    on_pool!(store.pool(), |p| {
        let mut tx = p.begin().await?;
        for chunk in rows.chunks(CHUNK_ROWS) {
            // Full chunks reuse one prepared statement; the last, shorter one is prepared once.
            let short;
            let sql = if chunk.len() == CHUNK_ROWS {
                full.as_str()
            } else {
                short = insert_sql(t, chunk.len());
                short.as_str()
            };
            let mut q = sqlx::query(sql).persistent(chunk.len() == CHUNK_ROWS);
            for row in chunk {
                for (c, v) in t.cols.iter().zip(row) {
                    q = match (c.kind, v) {
                        (_, Val::Int(i)) => q.bind(Some(*i)),
                        (_, Val::Real(f)) => q.bind(Some(*f)),
                        (_, Val::Text(s)) => q.bind(Some(s.as_str())),
                        (Kind::Int, Val::Null) => q.bind(None::<i64>),
                        (Kind::Real, Val::Null) => q.bind(None::<f64>),
                        (Kind::Text, Val::Null) => q.bind(None::<&str>),
                    };
                }
            }
            q.execute(&mut *tx).await?;
        }
        tx.commit().await?;
    });
    Ok(())
}

/// Moves each identity sequence past the imported ids (PostgreSQL; SQLite's AUTOINCREMENT
/// follows explicit ids by itself).
async fn reset_sequences(store: &Store) -> Result<(), TransferError> {
    let Pool::Postgres(p) = store.pool() else {
        return Ok(());
    };
    for t in TABLES.iter().filter(|t| t.identity) {
        let sql = format!(
            "SELECT setval(pg_get_serial_sequence('{0}', 'id'), COALESCE(MAX(id), 0) + 1, false) \
             FROM {0}",
            t.name
        );
        sqlx::query(&sql).execute(p).await?;
    }
    Ok(())
}

/// Reads an export from `input` into the empty store `store` (or, with `verify_only`, only
/// compares the store with the export's trailer), then verifies the store against the trailer.
/// Rows go in transactions of [`BATCH_ROWS`]; on an error the rows of earlier batches stay, so
/// the target should be dropped and the import run again.
pub async fn import(
    store: &Store,
    input: impl BufRead,
    verify_only: bool,
) -> Result<ImportReport, TransferError> {
    let mut lines = input.lines().enumerate().map(|(i, l)| (i + 1, l));
    let header = loop {
        match lines.next() {
            Some((_, Ok(l))) if l.trim().is_empty() => continue,
            Some((_, Ok(l))) => break l,
            Some((at, Err(e))) => return fail(format!("line {at}: {e}")),
            None => return fail("the input is empty (no export header)"),
        }
    };
    check_header(&header)?;
    if !verify_only {
        ensure_empty(store).await?;
    }

    let mut nul = 0u64;
    let mut inserted: Vec<(&'static str, u64)> = TABLES.iter().map(|t| (t.name, 0)).collect();
    let mut read: Vec<Tally> = TABLES.iter().map(|_| Tally::new()).collect();
    let mut current = 0usize;
    let mut batch: Vec<Vec<Val>> = Vec::new();
    let mut batch_bytes = 0usize;
    // Input lines of the first and last row of the batch.
    let (mut first, mut last) = (0usize, 0usize);
    let mut canonical = String::new();
    let mut trailer: Option<Trailer> = None;

    for (at, line) in lines {
        let line = line.map_err(|e| TransferError(format!("line {at}: {e}")))?;
        if line.trim().is_empty() {
            continue;
        }
        if trailer.is_some() {
            return fail(format!("line {at}: data after the trailer line"));
        }
        let v: Value = serde_json::from_str(&line)
            .map_err(|e| TransferError(format!("line {at}: not JSON: {e}")))?;
        if v.get("end").and_then(Value::as_bool) == Some(true) {
            trailer = Some(
                serde_json::from_value(v)
                    .map_err(|e| TransferError(format!("line {at}: bad trailer: {e}")))?,
            );
            continue;
        }
        let (Some(name), Some(r)) = (v["t"].as_str(), v["r"].as_object()) else {
            return fail(format!("line {at}: expected {{\"t\":table,\"r\":{{...}}}}"));
        };
        let Some(idx) = TABLES.iter().position(|t| t.name == name) else {
            return fail(format!("line {at}: unknown table '{name}'"));
        };
        if idx < current {
            return fail(format!(
                "line {at}: {name} after {} (tables must come in export order)",
                TABLES[current].name
            ));
        }
        if idx != current {
            if !verify_only {
                insert_batch(store, &TABLES[current], &batch, (first, last)).await?;
            }
            inserted[current].1 += batch.len() as u64;
            batch.clear();
            batch_bytes = 0;
            current = idx;
        }
        let t = &TABLES[idx];
        if batch.is_empty() {
            first = at;
        }
        last = at;
        let vals = parse_row(t, r, at, &mut nul)?;
        row_line(&mut canonical, t, &vals, true)?;
        read[idx].add(&canonical);
        batch_bytes += canonical.len();
        batch.push(vals);
        if batch.len() >= BATCH_ROWS || batch_bytes >= BATCH_BYTES {
            if !verify_only {
                insert_batch(store, t, &batch, (first, at)).await?;
            }
            inserted[idx].1 += batch.len() as u64;
            batch.clear();
            batch_bytes = 0;
        }
    }
    let Some(trailer) = trailer else {
        return fail(
            "the input ends without its trailer line: the export is incomplete (rows read so \
             far were imported; drop the target and import a complete export)",
        );
    };
    if !verify_only {
        insert_batch(store, &TABLES[current], &batch, (first, last)).await?;
        reset_sequences(store).await?;
    }
    inserted[current].1 += batch.len() as u64;
    if verify_only {
        inserted.iter_mut().for_each(|(_, n)| *n = 0);
    }

    let expected = |t: &str| {
        (
            trailer.counts.get(t).and_then(Value::as_u64),
            trailer.digest.get(t).and_then(Value::as_str),
        )
    };
    let verified = summarize(store).await?;
    let mut problems = Vec::new();
    for (got, input) in verified.tables.iter().zip(read) {
        let (count, digest) = expected(got.table);
        let (Some(count), Some(digest)) = (count, digest) else {
            problems.push(format!("{}: missing from the trailer", got.table));
            continue;
        };
        if got.rows != count {
            problems.push(format!(
                "{}: {} rows in the database, {count} in the export",
                got.table, got.rows
            ));
        } else if got.digest != digest {
            problems.push(format!("{}: the rows differ from the export's", got.table));
        }
        let input = input.finish(got.table);
        if input.rows != count || input.digest != digest {
            problems.push(format!(
                "{}: the input's own rows do not match its trailer (the file was edited or \
                 damaged)",
                got.table
            ));
        }
    }
    if !problems.is_empty() {
        return fail(format!("verification failed: {}", problems.join("; ")));
    }
    Ok(ImportReport {
        inserted,
        nul_replaced: nul,
        verified,
    })
}

/// The migrations a database still needs, compared with what this build knows.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MigrationState {
    /// Versions this build has that are not applied (all of them for a new database).
    pub pending: Vec<i64>,
    /// Applied versions whose file changed since (the gateway refuses to start on them).
    pub modified: Vec<i64>,
    /// Applied versions this build does not know (a newer build migrated the database).
    pub unknown: Vec<i64>,
}

/// Reads the migration state of the database `backend` names (`default_file` for the default
/// SQLite file) without changing anything: a missing SQLite file, or a database without the
/// `_sqlx_migrations` table, has every migration pending.
pub async fn migration_state(
    backend: &Backend,
    default_file: &Path,
    connect_timeout: Duration,
) -> Result<MigrationState, TransferError> {
    let applied: Vec<(i64, Vec<u8>)> = match backend {
        Backend::Sqlite(path) => {
            let path = path.as_deref().unwrap_or(default_file);
            if !path.exists() {
                Vec::new()
            } else {
                let options = sqlx::sqlite::SqliteConnectOptions::new()
                    .filename(path)
                    .read_only(true);
                let mut c = sqlx::SqliteConnection::connect_with(&options).await?;
                let has: i64 = sqlx::query_scalar(
                    "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' \
                     AND name = '_sqlx_migrations'",
                )
                .fetch_one(&mut c)
                .await?;
                let rows = if has > 0 {
                    sqlx::query_as(
                        "SELECT version, checksum FROM _sqlx_migrations WHERE success \
                         ORDER BY version",
                    )
                    .fetch_all(&mut c)
                    .await?
                } else {
                    Vec::new()
                };
                let _ = c.close().await;
                rows
            }
        }
        Backend::Postgres(url) => {
            let options = sqlx::postgres::PgConnectOptions::from_str(url)
                .map_err(|e| TransferError(format!("bad URL {}: {e}", without_password(url))))?;
            let mut c =
                tokio::time::timeout(connect_timeout, sqlx::PgConnection::connect_with(&options))
                    .await
                    .map_err(|_| TransferError("cannot connect to PostgreSQL: timed out".into()))?
                    .map_err(|e| TransferError(format!("cannot connect to PostgreSQL: {e}")))?;
            let table: Option<String> =
                sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations')::text")
                    .fetch_one(&mut c)
                    .await?;
            let rows = if table.is_some() {
                sqlx::query_as(
                    "SELECT version, checksum FROM _sqlx_migrations WHERE success \
                     ORDER BY version",
                )
                .fetch_all(&mut c)
                .await?
            } else {
                Vec::new()
            };
            let _ = c.close().await;
            rows
        }
    };
    let migrator = match backend {
        Backend::Sqlite(_) => &super::SQLITE_MIGRATIONS,
        Backend::Postgres(_) => &*super::POSTGRES_MIGRATIONS,
    };
    let known: Vec<_> = migrator
        .iter()
        .filter(|m| !m.migration_type.is_down_migration())
        .collect();
    let mut state = MigrationState::default();
    for m in &known {
        match applied.iter().find(|(v, _)| *v == m.version) {
            None => state.pending.push(m.version),
            Some((_, sum)) if sum.as_slice() != m.checksum.as_ref() => {
                state.modified.push(m.version)
            }
            Some(_) => {}
        }
    }
    state.unknown = applied
        .iter()
        .map(|(v, _)| *v)
        .filter(|v| !known.iter().any(|m| m.version == *v))
        .collect();
    Ok(state)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::config::store::StoreConfig;
    use crate::store::registry::Table as Reg;
    use crate::store::runs::RunRow;
    use crate::store::sessions::{MessageRow, NewSession, TurnTotals};
    use crate::store::usage::UsageRow;

    async fn sqlite(dir: &tempfile::TempDir, name: &str) -> Store {
        Store::open(&dir.path().join(name)).await.unwrap()
    }

    async fn postgres() -> Store {
        let url = super::super::pg_harness::database().await;
        Store::connect_postgres(&url, &StoreConfig::default())
            .await
            .unwrap()
    }

    crate::store::conformance::both!(
        columns_match_the_schema,
        a_non_empty_target_is_refused,
        other_formats_and_schemas_are_refused,
        migration_state_reads_without_changing,
    );

    fn admin() -> crate::api::tenancy::Tenant {
        crate::api::tenancy::Tenant::for_principal("admin", true)
    }

    fn msg(role: &str, content: &str) -> MessageRow {
        MessageRow {
            role: role.into(),
            content: content.into(),
            ..MessageRow::default()
        }
    }

    /// A bit of everything, through the store's own writes.
    async fn populate(s: &Store) {
        s.registry_insert(Reg::Providers, "p-B", r#"{"type":"openai"}"#, None)
            .await
            .unwrap();
        s.registry_insert(Reg::Providers, "p-a", r#"{"type":"scripted"}"#, Some("h"))
            .await
            .unwrap();
        s.registry_seed(Reg::Agents, "bot", r#"{"model":"p-a/m"}"#, "h1")
            .await
            .unwrap();
        s.agent_set_suspended("bot", true).await.unwrap();
        let job = crate::store::scheduler::JobRow {
            job_id: "job_1".into(),
            owner: "alice".into(),
            name: "daily".into(),
            agent_id: "bot".into(),
            message: "report\u{0}".into(),
            kind: "interval".into(),
            schedule: r#"{"kind":"interval","everyMs":1000}"#.into(),
            enabled: true,
            next_due_at: Some(1000),
            created_at: 1,
            updated_at: 1,
            ..Default::default()
        };
        s.cron_insert(&job, 10).await.unwrap();
        let claim = crate::store::scheduler::ClaimKind::Scheduled {
            due: 1000,
            next: Some(2000),
        };
        s.cron_claim(&job, claim, "schedule", 1001)
            .await
            .unwrap()
            .unwrap();
        s.beat_event("bot", "webhook:x", "event", 5).await.unwrap();
        s.beat_wake("bot", "trigger", true, 6).await.unwrap();
        for (key, tenant) in [("b", "alice"), ("B", "bob"), ("a:z", "alice")] {
            s.session_ensure(&NewSession {
                key,
                agent_id: "bot",
                channel: "api",
                tenant_id: Some(tenant),
                user_id: None,
            })
            .await
            .unwrap();
        }
        let totals = TurnTotals {
            input_tokens: 3,
            output_tokens: 4,
            cost_usd: 0.1 + 0.2,
            steps: 2,
            model: Some("p-a/m".into()),
            ..TurnTotals::default()
        };
        let mut turn = vec![msg("user", "hello Zürich"), msg("assistant", "")];
        turn[1].tool_calls = Some(r#"[{"id":"c1","name":"t","arguments":{}}]"#.into());
        turn[1].is_error = Some(false);
        turn[1].input_tokens = Some(7);
        let mut tool = msg("tool", "42 ✓");
        tool.tool_call_id = Some("c1".into());
        tool.tool_name = Some("t".into());
        tool.is_error = Some(true);
        turn.push(tool);
        s.session_append("a:z", &turn, &totals).await.unwrap();
        s.session_append("b", &[msg("user", "again")], &TurnTotals::default())
            .await
            .unwrap();
        s.note_add("a:z", "a note").await.unwrap();
        s.memory_insert_plain(
            "alice",
            "bot",
            Some("a:z"),
            "Paris in spring",
            &["t".into()],
        )
        .await
        .unwrap();
        s.memory_insert_plain("bob", "bot", None, "no session", &[])
            .await
            .unwrap();
        for i in 0..3i64 {
            s.usage_record(UsageRow {
                ts: 1_000 + i,
                agent_id: "bot".into(),
                session_key: (i > 0).then(|| "a:z".to_owned()),
                provider: "p-a".into(),
                model: "m".into(),
                operation: "chat".into(),
                input_tokens: i,
                cost_usd: 1e-7 * i as f64,
                ok: i != 2,
                error_kind: (i == 2).then(|| "timeout".to_owned()),
                ..UsageRow::default()
            })
            .unwrap();
        }
        s.usage_flush().await.unwrap();
        let run = RunRow {
            run_id: "r1".into(),
            root_run_id: "r1".into(),
            agent_id: "bot".into(),
            session_key: "a:z".into(),
            task: "t".into(),
            status: "completed".into(),
            client_id: "client".into(),
            started_at: 5,
            completed_at: Some(6),
            response: Some("done".into()),
            cost_usd: Some(0.25),
            ..RunRow::default()
        };
        s.run_insert(&run).await.unwrap();
        s.run_finish(&run).await.unwrap();
        s.webhook_delivery_seen("d1", 0, i64::MAX / 2, 10)
            .await
            .unwrap();
    }

    fn dump(s: &[u8]) -> Vec<String> {
        String::from_utf8(s.to_vec())
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    async fn export_lines(s: &Store) -> (Vec<u8>, Summary) {
        let mut out = Vec::new();
        let summary = export(s, &mut out).await.unwrap();
        (out, summary)
    }

    async fn max_id(s: &Store, table: &str) -> i64 {
        let sql = format!("SELECT COALESCE(MAX(id), 0) AS n FROM {table}");
        on_pool!(s.pool(), |p| sqlx::query_scalar::<_, i64>(&sql)
            .fetch_one(p)
            .await
            .unwrap())
    }

    /// One row in each table of the control plane.
    async fn populate_control(s: &Store) {
        use crate::store::control_plane::{AuditRow, AuthRow, SecretRow, TokenRow, VersionRow};
        s.approval_insert(&crate::store::approvals::ApprovalRow {
            id: "appr_1".into(),
            session_key: "agent:a:api:t:u".into(),
            agent_id: "a".into(),
            tool_name: "save_file".into(),
            summary: "save_file with arguments: path".into(),
            args_digest: "ab".repeat(32),
            owner: "t".into(),
            created_at: 1,
            expires_at: 2,
            ..Default::default()
        })
        .await
        .unwrap();
        s.denial_remember(
            "agent:a:api:t:u",
            "save_file",
            &"ab".repeat(32),
            Some("no"),
            3,
        )
        .await
        .unwrap();
        s.token_insert(&TokenRow {
            id: "app".into(),
            digest: Some("ab".repeat(32)),
            scopes: r#"["rpc"]"#.into(),
            created_at: 1,
            expires_at: None,
            last_used_at: None,
            revoked_at: None,
        })
        .await
        .unwrap();
        s.secret_put(&SecretRow {
            name: "K".into(),
            nonce: "bm9uY2U=".into(),
            ciphertext: "Y2lwaGVy".into(),
            provider: None,
            description: Some("d".into()),
            expires_at: None,
            created_at: 2,
            updated_at: 2,
        })
        .await
        .unwrap();
        s.auth_put(&AuthRow {
            profile_id: "p".into(),
            provider: "o".into(),
            nonce: "bm9uY2U=".into(),
            ciphertext: "Y2lwaGVy".into(),
            expires: 3,
            account_id: None,
            email: Some("e@x".into()),
            display_name: None,
            created_at: 3,
            updated_at: 3,
        })
        .await
        .unwrap();
        s.config_commit(&VersionRow {
            sha: "c".repeat(64),
            parent: None,
            message: "m".into(),
            author: Some("admin".into()),
            section: None,
            key: None,
            document: "{}".into(),
            created_at: 4,
        })
        .await
        .unwrap();
        s.audit_insert(&AuditRow {
            id: 0,
            ts: 5,
            pid: 6,
            origin: "rpc".into(),
            method: Some("config.set".into()),
            client_id: Some("admin".into()),
            paths: r#"["a.b"]"#.into(),
            commit_sha: None,
            suspicious: false,
            reasons: "[]".into(),
        })
        .await
        .unwrap();
    }

    async fn populate_obs(s: &Store) {
        use crate::store::obs::{ChannelTouch, DiagRow, ObsRow, PromptRow, TraceRow};
        s.trace_record(TraceRow {
            ts: 7,
            seq: 1,
            kind: "turn_end",
            session_key: "a:z".into(),
            trace_id: "t".repeat(32),
            finish_reason: Some("stop"),
            detail: Some("{}".into()),
            ..TraceRow::default()
        });
        s.obs_record(ObsRow::Diag(DiagRow {
            ts: 8,
            category: "message",
            kind: "message.completed",
            tenant_id: Some("alice".into()),
            data: r#"{"steps":1}"#.into(),
            ..DiagRow::default()
        }));
        s.obs_record(ObsRow::Prompt(PromptRow {
            session_key: "a:z".into(),
            agent_id: "a".into(),
            run_id: None,
            created_at: 9,
            report: "{}".into(),
        }));
        s.obs_record(ObsRow::Channel(ChannelTouch {
            channel_id: "api".into(),
            channel_type: "api".into(),
            ts: 10,
            sent: 1,
            received: 2,
        }));
        s.usage_flush().await.unwrap();
    }

    /// Saved graphs of two owners (one id each, in byte order apart), a run still held with
    /// its cancel requested and an ended one.
    async fn populate_graphs(s: &Store) {
        use crate::store::graphs::{GraphRow, GraphRunRow};
        for (owner, id) in [("alice", "a"), ("bob", "a"), ("alice", "B")] {
            s.graph_save(&GraphRow {
                owner: owner.into(),
                id: id.into(),
                label: format!("{owner}'s {id}"),
                agent_id: (owner == "alice").then(|| "bot".to_owned()),
                definition: r#"{"nodes":[{"id":"n1"}],"edges":[]}"#.into(),
                node_count: 1,
                created_at: 10,
                updated_at: 11,
            })
            .await
            .unwrap();
        }
        let live = GraphRunRow {
            run_id: "gr_live".into(),
            owner: "alice".into(),
            definition_id: Some("a".into()),
            status: "running".into(),
            node_count: 2,
            completed_nodes: 1,
            created_at: 12,
            started_at: Some(12),
            nodes: r#"{"n1":"completed","n2":"running"}"#.into(),
            ..GraphRunRow::default()
        };
        s.graph_run_insert(&live).await.unwrap();
        s.graph_run_request_cancel("gr_live").await.unwrap();
        let ended = GraphRunRow {
            run_id: "gr_done".into(),
            owner: "bob".into(),
            label: Some("inline".into()),
            status: "failed".into(),
            node_count: 1,
            failed_nodes: 1,
            artifact_count: 3,
            created_at: 13,
            started_at: Some(13),
            completed_at: Some(14),
            error: Some("n1 failed".into()),
            nodes: "{}".into(),
            ..GraphRunRow::default()
        };
        s.graph_run_insert(&ended).await.unwrap();
    }

    /// Export from `src`, import into `dst`: the same rows, ids kept, sequences past them.
    async fn round_trip(src: Store, dst: Store) {
        populate(&src).await;
        populate_control(&src).await;
        populate_obs(&src).await;
        populate_graphs(&src).await;
        let (bytes, summary) = export_lines(&src).await;
        let lines = dump(&bytes);
        let header: Value = serde_json::from_str(&lines[0]).unwrap();
        assert_eq!(header["format"], FORMAT);
        assert_eq!(header["version"], 1);
        assert_eq!(header["schema"], 12);
        assert_eq!(header["source"], src.backend_name());
        let rows = |t: &str| summary.tables.iter().find(|s| s.table == t).unwrap().rows;
        assert_eq!(
            TABLES.iter().map(|t| rows(t.name)).collect::<Vec<_>>(),
            [
                2, 1, 3, 4, 1, 2, 0, 0, 0, 0, 0, 1, 3, 1, 1, 1, 1, 1, 1, 1, 1, 3, 2, 1, 1, 1, 1, 0,
                0, 1, 1, 1, 1, 1
            ],
            "providers agents sessions messages notes memories (entities mentions observations \
             sources summaries: none) runs usage usage_hourly \
             deliveries cron_jobs cron_runs heartbeat_state heartbeat_events approvals \
             approval_denials graphs graph_runs api_tokens secrets \
             auth_profiles config_versions (config_document config_files_seen: none) \
             config_audit trace_rows diagnostics prompt_reports channel_activity"
        );
        assert_eq!(lines.len() as u64, summary.total_rows() + 2);
        assert!(lines[1].starts_with(r#"{"t":"providers","r":{"id":"p-B","kind":"openai""#));
        let trailer: Value = serde_json::from_str(lines.last().unwrap()).unwrap();
        assert_eq!(trailer["end"], true);
        assert_eq!(trailer["counts"]["messages"], 4);

        let report = import(&dst, bytes.as_slice(), false).await.unwrap();
        assert_eq!(report.nul_replaced, 0);
        assert_eq!(report.verified, summary);
        assert_eq!(
            report.inserted.iter().map(|(_, n)| *n).sum::<u64>(),
            summary.total_rows()
        );
        // Every row line is the same from the target (the header differs in source and time).
        let (again, summary2) = export_lines(&dst).await;
        assert_eq!(summary2, summary);
        assert_eq!(dump(&again)[1..], lines[1..]);

        // --verify-only agrees with a store just imported.
        let verified = import(&dst, bytes.as_slice(), true).await.unwrap();
        assert_eq!(verified.verified, summary);
        assert!(verified.inserted.iter().all(|(_, n)| *n == 0));
        // ... and notices one changed value (and only where it is).
        for (label, differs) in [("'changed'", true), ("NULL", false)] {
            let sql = format!("UPDATE sessions SET label = {label} WHERE session_key = 'B'");
            on_pool!(dst.pool(), |p| sqlx::query(&sql)
                .execute(p)
                .await
                .map(drop)
                .unwrap());
            let check = import(&dst, bytes.as_slice(), true).await;
            match check {
                Err(e) if differs => assert_eq!(
                    e.0,
                    "verification failed: sessions: the rows differ from the export's"
                ),
                Ok(_) if !differs => {}
                other => panic!("label {label}: {other:?}"),
            }
        }

        // Ids were kept, and a new row gets the next id on every identity table.
        for table in ["messages", "session_notes", "memories", "usage"] {
            assert_eq!(
                max_id(&dst, table).await,
                max_id(&src, table).await,
                "{table}"
            );
        }
        let before = [
            max_id(&dst, "messages").await,
            max_id(&dst, "session_notes").await,
            max_id(&dst, "memories").await,
            max_id(&dst, "usage").await,
        ];
        dst.session_append("b", &[msg("user", "after")], &TurnTotals::default())
            .await
            .unwrap();
        let note = dst.note_add("b", "after").await.unwrap();
        let memory = dst
            .memory_insert_plain("alice", "bot", None, "after", &[])
            .await
            .unwrap();
        dst.usage_record(UsageRow {
            agent_id: "bot".into(),
            provider: "p".into(),
            model: "m".into(),
            operation: "chat".into(),
            ..UsageRow::default()
        })
        .unwrap();
        dst.usage_flush().await.unwrap();
        assert_eq!(
            [
                max_id(&dst, "messages").await,
                note,
                memory,
                max_id(&dst, "usage").await
            ],
            before.map(|n| n + 1)
        );
        let history = dst.session_all_messages(&admin(), "b").await.unwrap();
        assert_eq!(
            history.iter().map(|m| m.seq).collect::<Vec<_>>(),
            [0, 1],
            "next_seq was kept"
        );
        // The search index of the target covers the imported rows.
        let hits = dst.search_messages(&admin(), "zürich", 10).await.unwrap();
        assert_eq!(hits.len(), 1, "{hits:?}");

        // --verify-only now notices the rows added since, and a changed row.
        let err = import(&dst, bytes.as_slice(), true).await.unwrap_err();
        assert!(
            err.0
                .contains("messages: 5 rows in the database, 4 in the export"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn sqlite_to_postgres() {
        let dir = tempfile::tempdir().unwrap();
        round_trip(sqlite(&dir, "src.db").await, postgres().await).await;
    }

    #[tokio::test]
    async fn postgres_to_sqlite() {
        let dir = tempfile::tempdir().unwrap();
        round_trip(postgres().await, sqlite(&dir, "dst.db").await).await;
    }

    #[tokio::test]
    async fn sqlite_to_sqlite() {
        let dir = tempfile::tempdir().unwrap();
        round_trip(sqlite(&dir, "a.db").await, sqlite(&dir, "b.db").await).await;
    }

    /// A SQLite file written before the store replaced U+0000 can hold it; PostgreSQL cannot.
    #[tokio::test]
    async fn nul_characters_are_replaced_counted_and_still_verify() {
        let dir = tempfile::tempdir().unwrap();
        let src = sqlite(&dir, "src.db").await;
        populate(&src).await;
        let Pool::Sqlite(p) = src.pool() else {
            unreachable!()
        };
        sqlx::query("UPDATE messages SET content = 'a' || char(0) || 'b' || char(0) WHERE seq = 0 AND session_key = 'a:z'")
            .execute(p)
            .await
            .unwrap();
        sqlx::query("UPDATE session_notes SET note = char(0)")
            .execute(p)
            .await
            .unwrap();
        let (bytes, _) = export_lines(&src).await;
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert!(text.contains(r#""a\u0000b\u0000""#), "exported as stored");

        let dst = postgres().await;
        let report = import(&dst, bytes.as_slice(), false).await.unwrap();
        assert_eq!(report.nul_replaced, 3, "two in a message, one in the note");
        let notes = dst.notes_list("a:z").await.unwrap();
        assert_eq!(notes[0].note, "\u{FFFD}");
        let history = dst.session_all_messages(&admin(), "a:z").await.unwrap();
        assert_eq!(history[0].content, "a\u{FFFD}b\u{FFFD}");
    }

    #[tokio::test]
    async fn a_tampered_row_fails_verification() {
        let dir = tempfile::tempdir().unwrap();
        let src = sqlite(&dir, "src.db").await;
        populate(&src).await;
        let (bytes, _) = export_lines(&src).await;
        let text = String::from_utf8(bytes).unwrap();
        assert_eq!(text.matches("Paris in spring").count(), 1);
        let tampered = text.replace("Paris in spring", "Paris in autumn");
        let dst = sqlite(&dir, "dst.db").await;
        let err = import(&dst, tampered.as_bytes(), false).await.unwrap_err();
        assert!(
            err.0
                .starts_with("verification failed: memories: the rows differ"),
            "{err}"
        );
        assert!(err.0.contains("the file was edited or damaged"), "{err}");
        assert!(!err.0.contains("messages"), "only memories differ: {err}");

        // A dump cut before its trailer is reported as incomplete.
        let cut: String = text.lines().take(5).map(|l| format!("{l}\n")).collect();
        let dst = sqlite(&dir, "cut.db").await;
        let err = import(&dst, cut.as_bytes(), false).await.unwrap_err();
        assert!(err.0.contains("without its trailer"), "{err}");
    }

    #[tokio::test]
    async fn bad_rows_name_their_line() {
        let dir = tempfile::tempdir().unwrap();
        let src = sqlite(&dir, "src.db").await;
        let (bytes, _) = export_lines(&src).await;
        let lines = dump(&bytes);
        let with = |row: &str| format!("{}\n{row}\n{}\n", lines[0], lines[1]);
        for (row, says) in [
            (r#"{"t":"nodes","r":{}}"#, "line 2: unknown table 'nodes'"),
            (
                r#"{"t":"webhook_deliveries","r":{"delivery":"d","expires_at":1.5}}"#,
                "line 2: webhook_deliveries.expires_at must be an integer",
            ),
            (
                r#"{"t":"webhook_deliveries","r":{"delivery":null,"expires_at":1}}"#,
                "webhook_deliveries.delivery must be a string, got null",
            ),
            (
                r#"{"t":"webhook_deliveries","r":{"delivery":"d"}}"#,
                "webhook_deliveries.expires_at is missing",
            ),
            (
                r#"{"t":"webhook_deliveries","r":{"delivery":"d","expires_at":1,"x":1}}"#,
                "webhook_deliveries has no column 'x'",
            ),
            ("not json", "line 2: not JSON"),
        ] {
            let dst = sqlite(&dir, &format!("{}.db", fastrand::u64(..))).await;
            let err = import(&dst, with(row).as_bytes(), false).await.unwrap_err();
            assert!(err.0.contains(says), "{row}: {err}");
        }
        // Tables out of order.
        let rows = format!(
            "{}\n{}\n{}\n{}\n",
            lines[0],
            r#"{"t":"webhook_deliveries","r":{"delivery":"d","expires_at":1}}"#,
            r#"{"t":"providers","r":{"id":"p","kind":"k","config":"{}","seed_hash":null,"created_at":1,"updated_at":1}}"#,
            lines[1]
        );
        let dst = sqlite(&dir, "order.db").await;
        let err = import(&dst, rows.as_bytes(), false).await.unwrap_err();
        assert!(
            err.0.contains("line 3: providers after webhook_deliveries"),
            "{err}"
        );
    }

    /// Tables larger than one batch (runs: 20 columns, 20,000 values in one statement) go in
    /// several transactions, and the ids and sequences come out right on PostgreSQL.
    #[tokio::test]
    async fn tables_larger_than_a_batch_cross_batch_boundaries() {
        let dir = tempfile::tempdir().unwrap();
        let src = sqlite(&dir, "src.db").await;
        let Pool::Sqlite(p) = src.pool() else {
            unreachable!()
        };
        sqlx::query(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 2345) \
             INSERT INTO usage (ts, agent_id, provider, model, operation, input_tokens, \
             output_tokens, cached_tokens, cost_usd, latency_ms, ok) \
             SELECT i, 'a', 'p', 'm', 'chat', i, 0, 0, i * 0.001, 1, 1 FROM n",
        )
        .execute(p)
        .await
        .unwrap();
        sqlx::query(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 1001) \
             INSERT INTO runs (run_id, root_run_id, agent_id, session_key, task, status, depth, \
             client_id, started_at) \
             SELECT printf('r%05d', i), 'r', 'a', 'k', 't', 'completed', 0, 'c', i FROM n",
        )
        .execute(p)
        .await
        .unwrap();
        let (bytes, summary) = export_lines(&src).await;
        let dst = postgres().await;
        let report = import(&dst, bytes.as_slice(), false).await.unwrap();
        assert_eq!(report.verified, summary);
        let got: Vec<(&str, u64)> = report
            .inserted
            .iter()
            .copied()
            .filter(|(_, n)| *n > 0)
            .collect();
        assert_eq!(got, [("runs", 1001), ("usage", 2345)]);
        dst.usage_record(UsageRow::default()).unwrap();
        dst.usage_flush().await.unwrap();
        assert_eq!(max_id(&dst, "usage").await, 2346);
    }

    #[tokio::test]
    async fn a_failing_batch_names_its_table_and_lines() {
        let dir = tempfile::tempdir().unwrap();
        let src = sqlite(&dir, "src.db").await;
        let (bytes, _) = export_lines(&src).await;
        let lines = dump(&bytes);
        let row = r#"{"t":"webhook_deliveries","r":{"delivery":"d","expires_at":1}}"#;
        let input = format!("{}\n{row}\n{row}\n{}\n", lines[0], lines[1]);
        let dst = postgres().await;
        let err = import(&dst, input.as_bytes(), false).await.unwrap_err();
        assert!(
            err.0
                .starts_with("lines 2-3 (webhook_deliveries): database: "),
            "{err}"
        );
    }

    /// PostgreSQL can hold NaN in a DOUBLE PRECISION column; JSON cannot say it.
    #[tokio::test]
    async fn a_non_finite_number_stops_the_export() {
        let s = postgres().await;
        s.usage_record(UsageRow::default()).unwrap();
        s.usage_flush().await.unwrap();
        let Pool::Postgres(p) = s.pool() else {
            unreachable!()
        };
        sqlx::query("UPDATE usage SET cost_usd = 'NaN'")
            .execute(p)
            .await
            .unwrap();
        let err = export(&s, &mut Vec::new()).await.unwrap_err();
        assert_eq!(
            err.0,
            "usage.cost_usd: the value NaN is not a finite number and cannot be exported"
        );
    }

    async fn columns_match_the_schema(s: Store) {
        for t in TABLES {
            let names: Vec<String> = match s.pool() {
                Pool::Sqlite(p) => {
                    sqlx::query_scalar("SELECT name FROM pragma_table_info($1) ORDER BY cid")
                        .bind(t.name)
                        .fetch_all(p)
                        .await
                        .unwrap()
                }
                Pool::Postgres(p) => sqlx::query_scalar(
                    "SELECT column_name::text FROM information_schema.columns \
                     WHERE table_name = $1 AND table_schema = current_schema() \
                     AND column_name <> 'content_tsv' ORDER BY ordinal_position",
                )
                .bind(t.name)
                .fetch_all(p)
                .await
                .unwrap(),
            };
            // Embeddings are not carried (the importing gateway embeds again).
            let names: Vec<String> = names
                .into_iter()
                .filter(|n| !(t.name == "memories" && n.starts_with("embedding")))
                .collect();
            let ours: Vec<&str> = t.cols.iter().map(|c| c.name).collect();
            assert_eq!(names, ours, "{}", t.name);
        }
    }

    async fn a_non_empty_target_is_refused(s: Store) {
        let dir = tempfile::tempdir().unwrap();
        let src = sqlite(&dir, "src.db").await;
        populate(&src).await;
        let (bytes, _) = export_lines(&src).await;
        s.registry_insert(Reg::Agents, "already", "{}", None)
            .await
            .unwrap();
        let err = import(&s, bytes.as_slice(), false).await.unwrap_err();
        assert_eq!(
            err.0,
            "the target database is not empty (agents has 1 rows): import needs a database no \
             gateway has served yet"
        );
        assert_eq!(
            summarize(&s).await.unwrap().total_rows(),
            1,
            "nothing added"
        );
    }

    async fn other_formats_and_schemas_are_refused(s: Store) {
        let trailer = Summary { tables: Vec::new() }.trailer();
        for (header, says) in [
            (
                r#"{"format":"agent-gateway-store","version":1,"schema":4}"#,
                "schema version 4 and this build is at version 12: migrate first",
            ),
            (
                r#"{"format":"agent-gateway-store","version":1,"schema":13}"#,
                "schema version 13, newer than this build's 12",
            ),
            (
                r#"{"format":"agent-gateway-store","version":2,"schema":5}"#,
                "export format version 2 is not supported",
            ),
            (
                r#"{"format":"pg_dump","version":1,"schema":5}"#,
                "not an agent-gateway export",
            ),
        ] {
            let input = format!(
                "{header}\n{}\n{trailer}\n",
                r#"{"t":"webhook_deliveries","r":{"delivery":"d","expires_at":1}}"#
            );
            let err = import(&s, input.as_bytes(), false).await.unwrap_err();
            assert!(err.0.starts_with("line 1: "), "{err}");
            assert!(err.0.contains(says), "{header}: {err}");
        }
        assert_eq!(s.webhook_deliveries_count().await.unwrap(), 0);
        let err = import(&s, &b""[..], false).await.unwrap_err();
        assert!(err.0.contains("empty"), "{err}");
    }

    async fn migration_state_reads_without_changing(s: Store) {
        let all: Vec<i64> = (1..=schema_version()).collect();
        match s.pool().clone() {
            Pool::Sqlite(_) => {
                let dir = tempfile::tempdir().unwrap();
                let file = dir.path().join("new.db");
                let b = Backend::Sqlite(Some(file.clone()));
                let state = migration_state(&b, &file, Duration::from_secs(10))
                    .await
                    .unwrap();
                assert_eq!(state.pending, all);
                assert!(!file.exists(), "the check creates nothing");
                // An empty file (no migrations table).
                std::fs::write(&file, b"").unwrap();
                let state = migration_state(&b, &file, Duration::from_secs(10))
                    .await
                    .unwrap();
                assert_eq!(state.pending, all);
                Store::open(&file).await.unwrap().close().await;
                let state = migration_state(&b, &file, Duration::from_secs(10))
                    .await
                    .unwrap();
                assert_eq!(state, MigrationState::default());
            }
            Pool::Postgres(_) => {
                let url = super::super::pg_harness::database().await;
                let b = Backend::Postgres(url.clone());
                let none = Path::new("/nonexistent");
                let state = migration_state(&b, none, Duration::from_secs(10))
                    .await
                    .unwrap();
                assert_eq!(state.pending, all);
                let state = migration_state(&b, none, Duration::from_secs(10))
                    .await
                    .unwrap();
                assert_eq!(state.pending, all, "the check applied nothing");
                let migrated = Store::connect_postgres(&url, &StoreConfig::default())
                    .await
                    .unwrap();
                migrated.close().await;
                let state = migration_state(&b, none, Duration::from_secs(10))
                    .await
                    .unwrap();
                assert_eq!(state, MigrationState::default());
            }
        }
    }
}
