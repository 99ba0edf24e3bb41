//! The memory tables: entries (`memories`, with their embeddings), entities and observations
//! derived from them, recall records, the persistent embedding cache; and `session_notes`, the
//! notes kept within one session.
//!
//! Every read and write of entries is scoped by a [`Tenant`] bound in SQL; the memory methods
//! always pass the reach of exactly one tenant.

use super::{now_ms, on_pool, text, Pool, Store, StoreRow};
use crate::api::error::GatewayError;
use crate::api::tenancy::Tenant;

/// One session note.
#[derive(Debug, Clone, PartialEq)]
pub struct NoteRow {
    pub id: i64,
    pub note: String,
    pub created_at: i64,
}

/// One memory entry as stored (without its vector).
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryRow {
    pub id: i64,
    pub tenant_id: String,
    pub agent_id: String,
    pub session_key: Option<String>,
    pub content: String,
    pub tags: Vec<String>,
    pub memory_type: String,
    pub trust_level: String,
    pub pinned: bool,
    pub created_at: i64,
    pub embedded: bool,
}

/// An entry to store.
#[derive(Debug, Clone)]
pub struct NewMemory<'a> {
    pub agent_id: &'a str,
    pub session_key: Option<&'a str>,
    pub content: &'a str,
    pub tags: &'a [String],
    pub memory_type: &'a str,
    pub trust_level: &'a str,
    pub pinned: bool,
    pub created_at: i64,
}

/// Which entries a browse, export, count or flush covers.
#[derive(Debug, Clone, Default)]
pub struct MemoryFilter<'a> {
    pub agent_id: Option<&'a str>,
    pub memory_type: Option<&'a str>,
    pub trust_level: Option<&'a str>,
    /// Entries carrying every one of these tags.
    pub tags: &'a [String],
    pub oldest_first: bool,
}

/// Counts of one tenant's (or agent's) memory.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MemoryCounts {
    pub total: i64,
    pub pinned: i64,
    pub embedded: i64,
    pub by_type: Vec<(String, i64)>,
    pub by_trust: Vec<(String, i64)>,
    pub by_agent: Vec<(String, i64)>,
    pub sessions: i64,
    pub observations: i64,
    pub entities: i64,
    pub oldest: Option<i64>,
    pub newest: Option<i64>,
}

/// An entity with its mention count.
#[derive(Debug, Clone, PartialEq)]
pub struct EntityRow {
    pub id: i64,
    pub name: String,
    pub mentions: i64,
    pub first_seen: i64,
    pub last_seen: i64,
}

/// An observation with its sources.
#[derive(Debug, Clone, PartialEq)]
pub struct ObservationRow {
    pub id: i64,
    pub content: String,
    pub confidence: f64,
    pub created_at: i64,
    pub consolidated_at: i64,
    pub sources: Vec<i64>,
}

/// One recall, content-free.
#[derive(Debug, Clone, PartialEq)]
pub struct RecallRecord {
    pub ts: i64,
    pub tenant_id: String,
    pub agent_id: String,
    pub session_key: Option<String>,
    pub trace_id: Option<String>,
    pub lanes: Vec<String>,
    pub candidate_count: i64,
    pub final_count: i64,
    pub entry_ids: Vec<i64>,
    pub duration_ms: i64,
}

/// Which recall records to read.
#[derive(Debug, Clone, Default)]
pub struct RecallQuery<'a> {
    pub agent_id: Option<&'a str>,
    pub session_key: Option<&'a str>,
    pub trace_id: Option<&'a str>,
    pub limit: i64,
}

/// An entry waiting for its embedding.
#[derive(Debug, Clone, PartialEq)]
pub struct Unembedded {
    pub id: i64,
    pub tenant_id: String,
    pub agent_id: String,
    pub content: String,
}

/// A stored vector, for loading the in-memory index.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredVector {
    pub id: i64,
    pub tenant_id: String,
    pub agent_id: String,
    pub vector: Vec<f32>,
}

/// What the model said about a batch of entries, to be stored by [`Store::memory_consolidated`].
#[derive(Debug, Clone, Default)]
pub struct Consolidation {
    /// Entity names and the entries mentioning them.
    pub entities: Vec<(String, Vec<i64>)>,
    /// Statements, their confidence and the entries supporting them.
    pub observations: Vec<(String, f64, Vec<i64>)>,
}

/// The columns every entry read selects.
const COLS: &str =
    "id, tenant_id, agent_id, session_key, content, tags, memory_type, trust_level, \
     pinned, created_at, CAST(CASE WHEN embedding IS NULL THEN 0 ELSE 1 END AS BIGINT) AS embedded";

/// Little-endian f32 bytes of a vector.
pub fn vector_bytes(v: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.len() * 4);
    for x in v {
        out.extend_from_slice(&x.to_le_bytes());
    }
    out
}

/// The vector of little-endian f32 bytes; None when the length is not a multiple of 4.
pub fn bytes_vector(b: &[u8]) -> Option<Vec<f32>> {
    if !b.len().is_multiple_of(4) {
        return None;
    }
    Some(
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    )
}

fn tags_of(json: &str) -> Vec<String> {
    serde_json::from_str(json).unwrap_or_default()
}

fn unembedded_row(r: &impl StoreRow) -> Result<Unembedded, sqlx::Error> {
    Ok(Unembedded {
        id: r.col("id")?,
        tenant_id: r.col("tenant_id")?,
        agent_id: r.col("agent_id")?,
        content: r.col("content")?,
    })
}

fn memory_row(r: &impl StoreRow) -> Result<MemoryRow, sqlx::Error> {
    Ok(MemoryRow {
        id: r.col("id")?,
        tenant_id: r.col::<Option<String>>("tenant_id")?.unwrap_or_default(),
        agent_id: r.col("agent_id")?,
        session_key: r.col("session_key")?,
        content: r.col("content")?,
        tags: tags_of(&r.col::<String>("tags")?),
        memory_type: r.col("memory_type")?,
        trust_level: r.col("trust_level")?,
        pinned: r.col::<i64>("pinned")? != 0,
        created_at: r.col("created_at")?,
        embedded: r.col::<i64>("embedded")? != 0,
    })
}

/// A LIKE pattern matching a JSON tags array that holds `tag` (its JSON string form), with the
/// LIKE wildcards of the tag escaped.
fn tag_pattern(tag: &str) -> String {
    let quoted = serde_json::to_string(tag).unwrap_or_default();
    let mut p = String::with_capacity(quoted.len() + 2);
    p.push('%');
    for c in quoted.chars() {
        if matches!(c, '%' | '_' | '!') {
            p.push('!');
        }
        p.push(c);
    }
    p.push('%');
    p
}

/// The WHERE clause of a filter, its parameters starting at `$first` (tenant, agent, type,
/// trust, then one per tag), and the values to bind after the tenant.
fn filter_sql(f: &MemoryFilter<'_>, first: usize) -> (String, Vec<String>) {
    let mut sql = format!(
        "(${t} IS NULL OR tenant_id = ${t}) AND (${a} IS NULL OR agent_id = ${a}) \
         AND (${m} IS NULL OR memory_type = ${m}) AND (${l} IS NULL OR trust_level = ${l})",
        t = first,
        a = first + 1,
        m = first + 2,
        l = first + 3
    );
    let mut binds = Vec::new();
    for (i, tag) in f.tags.iter().enumerate() {
        sql.push_str(&format!(" AND tags LIKE ${} ESCAPE '!'", first + 4 + i));
        binds.push(tag_pattern(tag));
    }
    (sql, binds)
}

macro_rules! bind_filter {
    ($q:expr, $tenant:expr, $f:expr, $tags:expr) => {{
        let mut q = $q
            .bind($tenant.only())
            .bind($f.agent_id)
            .bind($f.memory_type)
            .bind($f.trust_level);
        for t in $tags {
            q = q.bind(t);
        }
        q
    }};
}

/// The refusal of a write that would take a tenant past `memory.maxEntriesPerTenant`.
pub fn limit_reached(max_entries: u64) -> GatewayError {
    GatewayError::InvalidParams(format!(
        "memory.maxEntriesPerTenant ({max_entries}) reached for this tenant"
    ))
}

/// Whether `adding` more entries fit beside the `held` ones under `max_entries`.
fn fits(held: i64, adding: usize, max_entries: u64) -> bool {
    let held = u64::try_from(held).unwrap_or(0);
    let adding = u64::try_from(adding).unwrap_or(u64::MAX);
    held.checked_add(adding).is_some_and(|n| n <= max_entries)
}

/// Entries of one tenant, counted on the `memories_by_tenant (tenant_id, agent_id)` index (a
/// range of that index, never the table).
const COUNT_TENANT: &str = "SELECT COUNT(*) FROM memories WHERE tenant_id = $1";

/// Inserts `$entries` of `$owner` on `$tx` after counting the tenant's entries: refused whole
/// when they would pass `$max`. One body for both backends' transactions.
macro_rules! insert_counted {
    ($tx:ident, $owner:expr, $entries:expr, $max:expr, $now:expr) => {{
        let held: i64 = sqlx::query_scalar(COUNT_TENANT)
            .bind($owner)
            .fetch_one(&mut *$tx)
            .await?;
        if !fits(held, $entries.len(), $max) {
            return Err(limit_reached($max));
        }
        let mut ids = Vec::with_capacity($entries.len());
        for m in $entries {
            let tags = serde_json::to_string(m.tags).unwrap_or_else(|_| "[]".to_owned());
            let id: i64 = sqlx::query_scalar(
                "INSERT INTO memories (tenant_id, agent_id, session_key, content, tags, \
                 memory_type, trust_level, pinned, created_at, updated_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) RETURNING id",
            )
            .bind($owner)
            .bind(m.agent_id)
            .bind(m.session_key)
            .bind(text(m.content))
            .bind(&tags)
            .bind(m.memory_type)
            .bind(m.trust_level)
            .bind(i64::from(m.pinned))
            .bind(m.created_at)
            .bind($now)
            .fetch_one(&mut *$tx)
            .await?;
            ids.push(id);
        }
        $tx.commit().await?;
        ids
    }};
}

impl Store {
    /// Stores a memory owned by `owner`, refused when the tenant holds `max_entries` already;
    /// its id.
    pub async fn memory_insert(
        &self,
        owner: &str,
        m: &NewMemory<'_>,
        max_entries: u64,
    ) -> Result<i64, GatewayError> {
        let ids = self
            .memory_insert_many(owner, std::slice::from_ref(m), max_entries)
            .await?;
        ids.first()
            .copied()
            .ok_or_else(|| GatewayError::Internal("memory insert returned no id".to_owned()))
    }

    /// A learned semantic entry stored now (the store's own tests).
    #[cfg(test)]
    pub async fn memory_insert_plain(
        &self,
        owner: &str,
        agent_id: &str,
        session_key: Option<&str>,
        content: &str,
        tags: &[String],
    ) -> Result<i64, GatewayError> {
        self.memory_insert(
            owner,
            &NewMemory {
                agent_id,
                session_key,
                content,
                tags,
                memory_type: "semantic",
                trust_level: "learned",
                pinned: false,
                created_at: now_ms(),
            },
            u64::MAX,
        )
        .await
    }

    /// Stores many entries of `owner` in one transaction; their ids in order. All or nothing:
    /// when the tenant's entries and these would pass `max_entries`, nothing is stored and the
    /// answer is -32602 naming `memory.maxEntriesPerTenant`.
    ///
    /// The count and the inserts are one critical section per tenant, so concurrent writers
    /// cannot both take the last free place: SQLite's `BEGIN IMMEDIATE` takes the database's
    /// write lock before the count (a deferred transaction would read first and could fail
    /// on upgrading); PostgreSQL takes a transaction advisory lock on the tenant's name.
    pub async fn memory_insert_many(
        &self,
        owner: &str,
        entries: &[NewMemory<'_>],
        max_entries: u64,
    ) -> Result<Vec<i64>, GatewayError> {
        if entries.is_empty() {
            return Ok(Vec::new());
        }
        let now = now_ms();
        let ids = match self.pool() {
            Pool::Sqlite(p) => {
                let mut tx = p.begin_with("BEGIN IMMEDIATE").await?;
                insert_counted!(tx, owner, entries, max_entries, now)
            }
            Pool::Postgres(p) => {
                let mut tx = p.begin().await?;
                sqlx::query("SELECT pg_advisory_xact_lock(hashtext('memories:' || $1))")
                    .bind(owner)
                    .execute(&mut *tx)
                    .await?;
                insert_counted!(tx, owner, entries, max_entries, now)
            }
        };
        Ok(ids)
    }

    /// How many entries `owner` holds (derived entities and observations are not entries).
    pub async fn memory_tenant_count(&self, owner: &str) -> Result<i64, GatewayError> {
        Ok(on_pool!(self.pool(), |p| {
            sqlx::query_scalar(COUNT_TENANT)
                .bind(owner)
                .fetch_one(p)
                .await?
        }))
    }

    /// Refuses (-32602 naming the limit) when `adding` entries would take `owner` past
    /// `max_entries`: the check a dry run makes; a real write checks again in its transaction.
    pub async fn memory_check_room(
        &self,
        owner: &str,
        adding: usize,
        max_entries: u64,
    ) -> Result<(), GatewayError> {
        let held = self.memory_tenant_count(owner).await?;
        if fits(held, adding, max_entries) {
            Ok(())
        } else {
            Err(limit_reached(max_entries))
        }
    }

    /// One entry within `tenant`'s reach.
    pub async fn memory_get(
        &self,
        tenant: &Tenant,
        id: i64,
    ) -> Result<Option<MemoryRow>, GatewayError> {
        let sql =
            format!("SELECT {COLS} FROM memories WHERE id = $1 AND ($2 IS NULL OR tenant_id = $2)");
        Ok(on_pool!(self.pool(), |p| {
            match sqlx::query(&sql)
                .bind(id)
                .bind(tenant.only())
                .fetch_optional(p)
                .await?
            {
                Some(r) => Some(memory_row(&r)?),
                None => None,
            }
        }))
    }

    /// Entries by id within `tenant`'s reach, in the order of `ids` (missing ones skipped).
    pub async fn memory_rows(
        &self,
        tenant: &Tenant,
        ids: &[i64],
    ) -> Result<Vec<MemoryRow>, GatewayError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let list = ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
        let sql = format!(
            "SELECT {COLS} FROM memories WHERE id IN ({list}) AND ($1 IS NULL OR tenant_id = $1)"
        );
        let rows: Vec<MemoryRow> = on_pool!(self.pool(), |p| {
            let rows = sqlx::query(&sql).bind(tenant.only()).fetch_all(p).await?;
            rows.iter().map(memory_row).collect::<Result<_, _>>()?
        });
        let mut out = Vec::with_capacity(rows.len());
        for id in ids {
            if let Some(r) = rows.iter().find(|r| r.id == *id) {
                out.push(r.clone());
            }
        }
        Ok(out)
    }

    /// A page of entries matching `f` within `tenant`'s reach, and how many match in all.
    pub async fn memory_page(
        &self,
        tenant: &Tenant,
        f: &MemoryFilter<'_>,
        offset: i64,
        limit: i64,
    ) -> Result<(Vec<MemoryRow>, i64), GatewayError> {
        let (clause, tags) = filter_sql(f, 1);
        let order = if f.oldest_first {
            "created_at, id"
        } else {
            "created_at DESC, id DESC"
        };
        let n = 5 + tags.len();
        let page = format!(
            "SELECT {COLS} FROM memories WHERE {clause} ORDER BY {order} LIMIT ${n} OFFSET ${}",
            n + 1
        );
        let count = format!("SELECT COUNT(*) FROM memories WHERE {clause}");
        Ok(on_pool!(self.pool(), |p| {
            let rows = bind_filter!(sqlx::query(&page), tenant, f, &tags)
                .bind(limit)
                .bind(offset)
                .fetch_all(p)
                .await?;
            let total: i64 = bind_filter!(sqlx::query_scalar(&count), tenant, f, &tags)
                .fetch_one(p)
                .await?;
            (
                rows.iter().map(memory_row).collect::<Result<_, _>>()?,
                total,
            )
        }))
    }

    /// Pins or unpins an entry of `tenant` (of `agent` when given): whether it changed; None
    /// when there is no such entry.
    pub async fn memory_set_pinned(
        &self,
        tenant: &Tenant,
        id: i64,
        agent: Option<&str>,
        pinned: bool,
    ) -> Result<Option<bool>, GatewayError> {
        let want = i64::from(pinned);
        Ok(on_pool!(self.pool(), |p| {
            let current: Option<i64> = sqlx::query_scalar(
                "SELECT pinned FROM memories WHERE id = $1 AND ($2 IS NULL OR tenant_id = $2) \
                 AND ($3 IS NULL OR agent_id = $3)",
            )
            .bind(id)
            .bind(tenant.only())
            .bind(agent)
            .fetch_optional(p)
            .await?;
            match current {
                None => None,
                Some(c) if c == want => Some(false),
                Some(_) => {
                    sqlx::query("UPDATE memories SET pinned = $1, updated_at = $2 WHERE id = $3")
                        .bind(want)
                        .bind(now_ms())
                        .bind(id)
                        .execute(p)
                        .await?;
                    Some(true)
                }
            }
        }))
    }

    /// Deletes entries of `tenant` by id; the ids deleted. Observations left without a source
    /// and entities left without a mention go with them.
    pub async fn memory_delete_ids(
        &self,
        tenant: &Tenant,
        ids: &[i64],
    ) -> Result<Vec<i64>, GatewayError> {
        let mut deleted = Vec::new();
        on_pool!(self.pool(), |p| {
            let mut tx = p.begin().await?;
            for id in ids {
                let done = sqlx::query(
                    "DELETE FROM memories WHERE id = $1 AND ($2 IS NULL OR tenant_id = $2)",
                )
                .bind(id)
                .bind(tenant.only())
                .execute(&mut *tx)
                .await?
                .rows_affected();
                if done > 0 {
                    sqlx::query("DELETE FROM memory_observation_sources WHERE memory_id = $1")
                        .bind(id)
                        .execute(&mut *tx)
                        .await?;
                    deleted.push(*id);
                }
            }
            if !deleted.is_empty() {
                sqlx::query(
                    "DELETE FROM memory_observations WHERE NOT EXISTS \
                     (SELECT 1 FROM memory_observation_sources s WHERE s.observation_id = memory_observations.id)",
                )
                .execute(&mut *tx)
                .await?;
                sqlx::query(
                    "DELETE FROM memory_entities WHERE NOT EXISTS \
                     (SELECT 1 FROM memory_entity_mentions m WHERE m.entity_id = memory_entities.id)",
                )
                .execute(&mut *tx)
                .await?;
            }
            tx.commit().await?;
        });
        Ok(deleted)
    }

    /// Deletes every entry of `tenant` (of one agent when given) with the observations and
    /// entities of the same scope; how many entries.
    pub async fn memory_flush(
        &self,
        tenant: &Tenant,
        agent: Option<&str>,
    ) -> Result<i64, GatewayError> {
        let scope = "($1 IS NULL OR tenant_id = $1) AND ($2 IS NULL OR agent_id = $2)";
        Ok(on_pool!(self.pool(), |p| {
            let mut tx = p.begin().await?;
            let n = sqlx::query(&format!("DELETE FROM memories WHERE {scope}"))
                .bind(tenant.only())
                .bind(agent)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            sqlx::query(&format!("DELETE FROM memory_observations WHERE {scope}"))
                .bind(tenant.only())
                .bind(agent)
                .execute(&mut *tx)
                .await?;
            sqlx::query(&format!("DELETE FROM memory_entities WHERE {scope}"))
                .bind(tenant.only())
                .bind(agent)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            n as i64
        }))
    }

    /// Deletes the memories stored from one session that `tenant` reaches; their ids.
    pub async fn memory_delete_by_session(
        &self,
        tenant: &Tenant,
        session_key: &str,
    ) -> Result<Vec<i64>, GatewayError> {
        let ids: Vec<i64> = on_pool!(self.pool(), |p| sqlx::query_scalar(
            "SELECT id FROM memories WHERE session_key = $1 AND ($2 IS NULL OR tenant_id = $2)",
        )
        .bind(session_key)
        .bind(tenant.only())
        .fetch_all(p)
        .await?);
        self.memory_delete_ids(tenant, &ids).await
    }

    /// Deletes every observation derived from an entry learned in `session_key`, even those
    /// other sessions support too (`session.reset_conversation` purge_derived); how many.
    pub async fn memory_purge_derived_by_session(
        &self,
        tenant: &Tenant,
        session_key: &str,
    ) -> Result<i64, GatewayError> {
        Ok(on_pool!(self.pool(), |p| sqlx::query(
            "DELETE FROM memory_observations WHERE ($2 IS NULL OR tenant_id = $2) AND id IN \
             (SELECT observation_id FROM memory_observation_sources WHERE session_key = $1)",
        )
        .bind(session_key)
        .bind(tenant.only())
        .execute(p)
        .await?
        .rows_affected() as i64))
    }

    /// Counts of `tenant`'s memory (one agent's when given).
    pub async fn memory_counts(
        &self,
        tenant: &Tenant,
        agent: Option<&str>,
    ) -> Result<MemoryCounts, GatewayError> {
        let scope = "($1 IS NULL OR tenant_id = $1) AND ($2 IS NULL OR agent_id = $2)";
        let grouped = |col: &str| {
            format!("SELECT {col} AS k, COUNT(*) AS n FROM memories WHERE {scope} GROUP BY {col} ORDER BY {col}")
        };
        let (by_type_sql, by_trust_sql, by_agent_sql) = (
            grouped("memory_type"),
            grouped("trust_level"),
            grouped("agent_id"),
        );
        let totals_sql = format!(
            "SELECT COUNT(*) AS total, COALESCE(SUM(pinned), 0) AS pinned, \
             COUNT(embedding) AS embedded, COUNT(DISTINCT session_key) AS sessions, \
             MIN(created_at) AS oldest, MAX(created_at) AS newest, \
             (SELECT COUNT(*) FROM memory_observations WHERE {scope}) AS observations, \
             (SELECT COUNT(*) FROM memory_entities WHERE {scope}) AS entities \
             FROM memories WHERE {scope}"
        );
        Ok(on_pool!(self.pool(), |p| {
            let r = sqlx::query(&totals_sql)
                .bind(tenant.only())
                .bind(agent)
                .fetch_one(p)
                .await?;
            let mut c = MemoryCounts {
                total: r.col("total")?,
                pinned: r.col::<Option<i64>>("pinned")?.unwrap_or(0),
                embedded: r.col("embedded")?,
                sessions: r.col("sessions")?,
                observations: r.col("observations")?,
                entities: r.col("entities")?,
                oldest: r.col("oldest")?,
                newest: r.col("newest")?,
                ..MemoryCounts::default()
            };
            for (sql, out) in [
                (&by_type_sql, &mut c.by_type),
                (&by_trust_sql, &mut c.by_trust),
                (&by_agent_sql, &mut c.by_agent),
            ] {
                for r in sqlx::query(sql)
                    .bind(tenant.only())
                    .bind(agent)
                    .fetch_all(p)
                    .await?
                {
                    out.push((r.col("k")?, r.col("n")?));
                }
            }
            c
        }))
    }

    /// Entries waiting for an embedding by `model` (none yet, or another model's), oldest
    /// first, after id `after`.
    pub async fn memory_unembedded(
        &self,
        model: &str,
        after: i64,
        limit: i64,
    ) -> Result<Vec<Unembedded>, GatewayError> {
        Ok(on_pool!(self.pool(), |p| {
            let rows = sqlx::query(
                "SELECT id, tenant_id, agent_id, content FROM memories \
                 WHERE id > $1 AND tenant_id IS NOT NULL \
                 AND (embedding IS NULL OR embedding_model IS NULL OR embedding_model <> $2) \
                 ORDER BY id LIMIT $3",
            )
            .bind(after)
            .bind(model)
            .bind(limit)
            .fetch_all(p)
            .await?;
            rows.iter().map(unembedded_row).collect::<Result<_, _>>()?
        }))
    }

    /// Entries by id with their tenant and content (for embedding); missing ids skipped.
    pub async fn memory_for_embedding(&self, ids: &[i64]) -> Result<Vec<Unembedded>, GatewayError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let list = ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
        let sql = format!(
            "SELECT id, tenant_id, agent_id, content FROM memories \
             WHERE id IN ({list}) AND tenant_id IS NOT NULL"
        );
        Ok(on_pool!(self.pool(), |p| {
            let rows = sqlx::query(&sql).fetch_all(p).await?;
            rows.iter().map(unembedded_row).collect::<Result<_, _>>()?
        }))
    }

    /// Stores the embeddings of entries (id, vector) made by `model`, in one transaction; the
    /// ids updated. An entry deleted meanwhile is simply not updated (nor returned).
    pub async fn memory_set_embeddings(
        &self,
        model: &str,
        vectors: &[(i64, Vec<f32>)],
    ) -> Result<Vec<i64>, GatewayError> {
        let mut updated = Vec::with_capacity(vectors.len());
        on_pool!(self.pool(), |p| {
            let mut tx = p.begin().await?;
            for (id, v) in vectors {
                let n = sqlx::query(
                    "UPDATE memories SET embedding = $1, embedding_model = $2 WHERE id = $3",
                )
                .bind(vector_bytes(v))
                .bind(model)
                .bind(id)
                .execute(&mut *tx)
                .await?
                .rows_affected();
                if n > 0 {
                    updated.push(*id);
                }
            }
            tx.commit().await?;
        });
        Ok(updated)
    }

    /// A page of the stored vectors of `model`, by id after `after` (loading the index).
    pub async fn memory_vectors(
        &self,
        model: &str,
        after: i64,
        limit: i64,
    ) -> Result<Vec<StoredVector>, GatewayError> {
        Ok(on_pool!(self.pool(), |p| {
            let rows = sqlx::query(
                "SELECT id, tenant_id, agent_id, embedding FROM memories \
                 WHERE id > $1 AND embedding_model = $2 AND embedding IS NOT NULL \
                 AND tenant_id IS NOT NULL ORDER BY id LIMIT $3",
            )
            .bind(after)
            .bind(model)
            .bind(limit)
            .fetch_all(p)
            .await?;
            let mut out = Vec::with_capacity(rows.len());
            for r in &rows {
                let bytes: Vec<u8> = r.col("embedding")?;
                if let Some(vector) = bytes_vector(&bytes) {
                    out.push(StoredVector {
                        id: r.col("id")?,
                        tenant_id: r.col("tenant_id")?,
                        agent_id: r.col("agent_id")?,
                        vector,
                    });
                }
            }
            out
        }))
    }

    /// The entity lane: ids of `tenant`'s entries mentioning an entity whose name occurs in
    /// `query` (lowercased, as whole words), newest first.
    pub async fn memory_entity_ids(
        &self,
        tenant: &Tenant,
        agent: Option<&str>,
        query: &str,
        limit: i64,
    ) -> Result<Vec<i64>, GatewayError> {
        let norm = format!(" {} ", normalise_name(query));
        Ok(on_pool!(self.pool(), |p| sqlx::query_scalar(
            "SELECT m.memory_id FROM memory_entities e \
             JOIN memory_entity_mentions m ON m.entity_id = e.id \
             WHERE ($1 IS NULL OR e.tenant_id = $1) AND ($2 IS NULL OR e.agent_id = $2) \
             AND $3 LIKE '% ' || e.norm || ' %' \
             GROUP BY m.memory_id ORDER BY COUNT(*) DESC, m.memory_id DESC LIMIT $4",
        )
        .bind(tenant.only())
        .bind(agent)
        .bind(&norm)
        .bind(limit)
        .fetch_all(p)
        .await?))
    }

    /// A cached embedding of a text by `model`.
    pub async fn embedding_cache_get(
        &self,
        hash: &str,
        model: &str,
    ) -> Result<Option<Vec<f32>>, GatewayError> {
        let bytes: Option<Vec<u8>> = on_pool!(self.pool(), |p| sqlx::query_scalar(
            "SELECT vector FROM embedding_cache WHERE content_hash = $1 AND model = $2",
        )
        .bind(hash)
        .bind(model)
        .fetch_optional(p)
        .await?);
        Ok(bytes.and_then(|b| bytes_vector(&b)))
    }

    /// Caches embeddings (hash, vector) made by `model`.
    pub async fn embedding_cache_put(
        &self,
        model: &str,
        items: &[(String, Vec<f32>)],
    ) -> Result<(), GatewayError> {
        let now = now_ms();
        on_pool!(self.pool(), |p| {
            let mut tx = p.begin().await?;
            for (hash, v) in items {
                sqlx::query(
                    "INSERT INTO embedding_cache (content_hash, model, dims, vector, created_at) \
                     VALUES ($1, $2, $3, $4, $5) ON CONFLICT (content_hash, model) DO NOTHING",
                )
                .bind(hash)
                .bind(model)
                .bind(v.len() as i64)
                .bind(vector_bytes(v))
                .bind(now)
                .execute(&mut *tx)
                .await?;
            }
            tx.commit().await?;
        });
        Ok(())
    }

    /// Entries and bytes in the persistent embedding cache.
    pub async fn embedding_cache_size(&self) -> Result<(i64, i64), GatewayError> {
        Ok(on_pool!(self.pool(), |p| {
            let r = sqlx::query(
                "SELECT COUNT(*) AS n, COALESCE(SUM(LENGTH(vector) + LENGTH(content_hash) + LENGTH(model) + 24), 0) AS b \
                 FROM embedding_cache",
            )
            .fetch_one(p)
            .await?;
            (r.col("n")?, r.col::<Option<i64>>("b")?.unwrap_or(0))
        }))
    }

    /// Entries of one agent not consolidated yet, oldest first.
    pub async fn memory_unconsolidated(
        &self,
        tenant: &Tenant,
        agent: &str,
        limit: i64,
    ) -> Result<Vec<MemoryRow>, GatewayError> {
        let sql = format!(
            "SELECT {COLS} FROM memories WHERE ($1 IS NULL OR tenant_id = $1) AND agent_id = $2 \
             AND consolidated_at IS NULL ORDER BY id LIMIT $3"
        );
        Ok(on_pool!(self.pool(), |p| {
            let rows = sqlx::query(&sql)
                .bind(tenant.only())
                .bind(agent)
                .bind(limit)
                .fetch_all(p)
                .await?;
            rows.iter().map(memory_row).collect::<Result<_, _>>()?
        }))
    }

    /// How many entries of one agent are not consolidated yet.
    pub async fn memory_unconsolidated_count(
        &self,
        owner: &str,
        agent: &str,
    ) -> Result<i64, GatewayError> {
        Ok(on_pool!(self.pool(), |p| sqlx::query_scalar(
            "SELECT COUNT(*) FROM memories WHERE tenant_id = $1 AND agent_id = $2 \
             AND consolidated_at IS NULL",
        )
        .bind(owner)
        .bind(agent)
        .fetch_one(p)
        .await?))
    }

    /// Stores what a consolidation found about `entries` (all of `owner` and `agent`) and marks
    /// them consolidated; the number of observations created.
    pub async fn memory_consolidated(
        &self,
        owner: &str,
        agent: &str,
        entries: &[MemoryRow],
        found: &Consolidation,
    ) -> Result<i64, GatewayError> {
        let now = now_ms();
        let session_of = |id: i64| {
            entries
                .iter()
                .find(|e| e.id == id)
                .and_then(|e| e.session_key.clone())
        };
        let created_of = |id: i64| {
            entries
                .iter()
                .find(|e| e.id == id)
                .map_or(now, |e| e.created_at)
        };
        let mut created = 0;
        on_pool!(self.pool(), |p| {
            let mut tx = p.begin().await?;
            for (name, ids) in &found.entities {
                let norm = normalise_name(name);
                if norm.is_empty() || ids.is_empty() {
                    continue;
                }
                let first = ids.iter().map(|i| created_of(*i)).min().unwrap_or(now);
                let last = ids.iter().map(|i| created_of(*i)).max().unwrap_or(now);
                let id: i64 = sqlx::query_scalar(
                    "INSERT INTO memory_entities (tenant_id, agent_id, name, norm, first_seen, last_seen) \
                     VALUES ($1, $2, $3, $4, $5, $6) \
                     ON CONFLICT (tenant_id, agent_id, norm) DO UPDATE SET \
                     first_seen = CASE WHEN memory_entities.first_seen < excluded.first_seen \
                                  THEN memory_entities.first_seen ELSE excluded.first_seen END, \
                     last_seen = CASE WHEN memory_entities.last_seen > excluded.last_seen \
                                 THEN memory_entities.last_seen ELSE excluded.last_seen END \
                     RETURNING id",
                )
                .bind(owner)
                .bind(agent)
                .bind(text(name))
                .bind(&norm)
                .bind(first)
                .bind(last)
                .fetch_one(&mut *tx)
                .await?;
                for m in ids {
                    sqlx::query(
                        "INSERT INTO memory_entity_mentions (entity_id, memory_id) VALUES ($1, $2) \
                         ON CONFLICT (entity_id, memory_id) DO NOTHING",
                    )
                    .bind(id)
                    .bind(m)
                    .execute(&mut *tx)
                    .await?;
                }
            }
            for (content, confidence, ids) in &found.observations {
                let id: i64 = sqlx::query_scalar(
                    "INSERT INTO memory_observations (tenant_id, agent_id, content, confidence, \
                     created_at, consolidated_at) VALUES ($1, $2, $3, $4, $5, $5) RETURNING id",
                )
                .bind(owner)
                .bind(agent)
                .bind(text(content))
                .bind(confidence)
                .bind(now)
                .fetch_one(&mut *tx)
                .await?;
                created += 1;
                for m in ids {
                    sqlx::query(
                        "INSERT INTO memory_observation_sources (observation_id, memory_id, session_key) \
                         VALUES ($1, $2, $3) ON CONFLICT (observation_id, memory_id) DO NOTHING",
                    )
                    .bind(id)
                    .bind(m)
                    .bind(session_of(*m))
                    .execute(&mut *tx)
                    .await?;
                }
            }
            for e in entries {
                sqlx::query("UPDATE memories SET consolidated_at = $1 WHERE id = $2")
                    .bind(now)
                    .bind(e.id)
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await?;
        });
        Ok(created)
    }

    /// Entities of `tenant` (one agent's when given), most mentioned first.
    pub async fn memory_entities(
        &self,
        tenant: &Tenant,
        agent: Option<&str>,
        limit: i64,
    ) -> Result<Vec<EntityRow>, GatewayError> {
        Ok(on_pool!(self.pool(), |p| {
            let rows = sqlx::query(
                "SELECT e.id, e.name, e.first_seen, e.last_seen, \
                 (SELECT COUNT(*) FROM memory_entity_mentions m WHERE m.entity_id = e.id) AS mentions \
                 FROM memory_entities e WHERE ($1 IS NULL OR e.tenant_id = $1) \
                 AND ($2 IS NULL OR e.agent_id = $2) ORDER BY mentions DESC, e.id LIMIT $3",
            )
            .bind(tenant.only())
            .bind(agent)
            .bind(limit)
            .fetch_all(p)
            .await?;
            let mut out = Vec::with_capacity(rows.len());
            for r in &rows {
                out.push(EntityRow {
                    id: r.col("id")?,
                    name: r.col("name")?,
                    mentions: r.col("mentions")?,
                    first_seen: r.col("first_seen")?,
                    last_seen: r.col("last_seen")?,
                });
            }
            out
        }))
    }

    /// Observations of `tenant` (one agent's when given), newest first, with their sources.
    pub async fn memory_observations(
        &self,
        tenant: &Tenant,
        agent: Option<&str>,
        limit: i64,
    ) -> Result<Vec<ObservationRow>, GatewayError> {
        Ok(on_pool!(self.pool(), |p| {
            let rows = sqlx::query(
                "SELECT id, content, confidence, created_at, consolidated_at FROM memory_observations \
                 WHERE ($1 IS NULL OR tenant_id = $1) AND ($2 IS NULL OR agent_id = $2) \
                 ORDER BY created_at DESC, id DESC LIMIT $3",
            )
            .bind(tenant.only())
            .bind(agent)
            .bind(limit)
            .fetch_all(p)
            .await?;
            let mut out = Vec::with_capacity(rows.len());
            for r in &rows {
                let id: i64 = r.col("id")?;
                let sources: Vec<i64> = sqlx::query_scalar(
                    "SELECT memory_id FROM memory_observation_sources WHERE observation_id = $1 \
                     ORDER BY memory_id",
                )
                .bind(id)
                .fetch_all(p)
                .await?;
                out.push(ObservationRow {
                    id,
                    content: r.col("content")?,
                    confidence: r.col("confidence")?,
                    created_at: r.col("created_at")?,
                    consolidated_at: r.col("consolidated_at")?,
                    sources,
                });
            }
            out
        }))
    }

    /// Records one recall.
    pub async fn memory_recall_record(&self, r: &RecallRecord) -> Result<(), GatewayError> {
        let ids = serde_json::to_string(&r.entry_ids).unwrap_or_else(|_| "[]".to_owned());
        on_pool!(self.pool(), |p| sqlx::query(
            "INSERT INTO memory_recalls (ts, tenant_id, agent_id, session_key, trace_id, lanes, \
             candidate_count, final_count, entry_ids, duration_ms) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        )
        .bind(r.ts)
        .bind(&r.tenant_id)
        .bind(&r.agent_id)
        .bind(&r.session_key)
        .bind(&r.trace_id)
        .bind(r.lanes.join(","))
        .bind(r.candidate_count)
        .bind(r.final_count)
        .bind(&ids)
        .bind(r.duration_ms)
        .execute(p)
        .await
        .map(|_| ())?);
        Ok(())
    }

    /// Recall records of `tenant`, newest first.
    pub async fn memory_recalls(
        &self,
        tenant: &Tenant,
        q: &RecallQuery<'_>,
    ) -> Result<Vec<RecallRecord>, GatewayError> {
        Ok(on_pool!(self.pool(), |p| {
            let rows = sqlx::query(
                "SELECT ts, tenant_id, agent_id, session_key, trace_id, lanes, candidate_count, \
                 final_count, entry_ids, duration_ms FROM memory_recalls \
                 WHERE ($1 IS NULL OR tenant_id = $1) AND ($2 IS NULL OR agent_id = $2) \
                 AND ($3 IS NULL OR session_key = $3) AND ($4 IS NULL OR trace_id = $4) \
                 ORDER BY ts DESC, id DESC LIMIT $5",
            )
            .bind(tenant.only())
            .bind(q.agent_id)
            .bind(q.session_key)
            .bind(q.trace_id)
            .bind(q.limit)
            .fetch_all(p)
            .await?;
            let mut out = Vec::with_capacity(rows.len());
            for r in &rows {
                let lanes: String = r.col("lanes")?;
                out.push(RecallRecord {
                    ts: r.col("ts")?,
                    tenant_id: r.col("tenant_id")?,
                    agent_id: r.col("agent_id")?,
                    session_key: r.col("session_key")?,
                    trace_id: r.col("trace_id")?,
                    lanes: lanes
                        .split(',')
                        .filter(|l| !l.is_empty())
                        .map(str::to_owned)
                        .collect(),
                    candidate_count: r.col("candidate_count")?,
                    final_count: r.col("final_count")?,
                    entry_ids: serde_json::from_str(&r.col::<String>("entry_ids")?)
                        .unwrap_or_default(),
                    duration_ms: r.col("duration_ms")?,
                });
            }
            out
        }))
    }

    /// Deletes recall records older than `before`; how many.
    pub async fn memory_recalls_sweep(&self, before: i64) -> Result<u64, GatewayError> {
        Ok(on_pool!(self.pool(), |p| sqlx::query(
            "DELETE FROM memory_recalls WHERE ts < $1"
        )
        .bind(before)
        .execute(p)
        .await?
        .rows_affected()))
    }

    /// Adds a note to a session; its id.
    pub async fn note_add(&self, session_key: &str, note: &str) -> Result<i64, GatewayError> {
        Ok(on_pool!(self.pool(), |p| {
            sqlx::query_scalar::<_, i64>(
            "INSERT INTO session_notes (session_key, note, created_at) VALUES ($1, $2, $3) RETURNING id",
        )
        .bind(session_key)
        .bind(text(note))
        .bind(now_ms())
        .fetch_one(p)
        .await?
        }))
    }

    /// A session's notes, oldest first.
    pub async fn notes_list(&self, session_key: &str) -> Result<Vec<NoteRow>, GatewayError> {
        Ok(on_pool!(self.pool(), |p| {
            let rows = sqlx::query(
                "SELECT id, note, created_at FROM session_notes WHERE session_key = $1 ORDER BY id",
            )
            .bind(session_key)
            .fetch_all(p)
            .await?;
            let mut notes = Vec::with_capacity(rows.len());
            for r in &rows {
                notes.push(NoteRow {
                    id: r.col("id")?,
                    note: r.col("note")?,
                    created_at: r.col("created_at")?,
                });
            }
            notes
        }))
    }
}

/// A name or text as entity names are compared: lowercase words separated by single spaces.
pub fn normalise_name(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for word in s
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
    {
        if !out.is_empty() {
            out.push(' ');
        }
        out.extend(word.chars().flat_map(char::to_lowercase));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    crate::store::conformance::both!(the_tenant_limit_holds_per_tenant_and_under_concurrency);

    fn entry(content: &str) -> NewMemory<'_> {
        NewMemory {
            agent_id: "bot",
            session_key: None,
            content,
            tags: &[],
            memory_type: "semantic",
            trust_level: "learned",
            pinned: false,
            created_at: now_ms(),
        }
    }

    fn is_limit(r: Result<impl std::fmt::Debug, GatewayError>, max: u64) {
        match r {
            Err(GatewayError::InvalidParams(m)) => assert_eq!(
                m,
                format!("memory.maxEntriesPerTenant ({max}) reached for this tenant")
            ),
            other => panic!("not refused at the limit: {other:?}"),
        }
    }

    async fn the_tenant_limit_holds_per_tenant_and_under_concurrency(s: Store) {
        // The write that makes it exactly 3 passes; the next is refused.
        for i in 0..3 {
            s.memory_insert("t1", &entry(&format!("fact {i}")), 3)
                .await
                .unwrap();
        }
        is_limit(s.memory_insert("t1", &entry("fourth"), 3).await, 3);
        assert_eq!(s.memory_tenant_count("t1").await.unwrap(), 3);
        // Another tenant is unaffected.
        s.memory_insert("t2", &entry("other tenant"), 3)
            .await
            .unwrap();
        // Many at once: counted whole, all or nothing.
        let three = [entry("a"), entry("b"), entry("c")];
        is_limit(s.memory_insert_many("t2", &three, 3).await, 3);
        assert_eq!(s.memory_tenant_count("t2").await.unwrap(), 1);
        is_limit(s.memory_check_room("t2", 3, 3).await, 3);
        s.memory_check_room("t2", 2, 3).await.unwrap();
        let ids = s.memory_insert_many("t2", &three[..2], 3).await.unwrap();
        assert_eq!(ids.len(), 2);
        assert_eq!(s.memory_tenant_count("t2").await.unwrap(), 3);
        assert!(s.memory_insert_many("t2", &[], 3).await.unwrap().is_empty());
        // A limit lowered below what a tenant holds refuses its writes, and nothing more.
        is_limit(s.memory_insert("t2", &entry("d"), 2).await, 2);
        // Concurrent writers never take the tenant past its limit together.
        let writes = (0..8).map(|i| {
            let s = s.clone();
            async move {
                let content = format!("racing {i}");
                s.memory_insert("t3", &entry(&content), 5).await
            }
        });
        let results = futures_util::future::join_all(writes).await;
        let stored = results.iter().filter(|r| r.is_ok()).count();
        assert_eq!(stored, 5, "{results:?}");
        for r in results.into_iter().filter(|r| r.is_err()) {
            is_limit(r, 5);
        }
        assert_eq!(s.memory_tenant_count("t3").await.unwrap(), 5);
    }

    #[test]
    fn vectors_round_trip_through_bytes() {
        let v = vec![0.5f32, -1.25, 3.0e-7, f32::MAX];
        assert_eq!(bytes_vector(&vector_bytes(&v)), Some(v));
        assert_eq!(bytes_vector(&[1, 2, 3]), None);
    }

    #[test]
    fn tag_patterns_escape_like_wildcards() {
        assert_eq!(tag_pattern("a_b%"), "%\"a!_b!%\"%");
        assert_eq!(tag_pattern("x"), "%\"x\"%");
    }
}
