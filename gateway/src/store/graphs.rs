//! The graph tables (migration 0012): graphs saved per owner, and graph runs with their
//! progress, holder node and cancel requests.
//!
//! A graph's id is unique within its owner only, so every graph operation names the owner. A
//! run is held by the node executing it (`claimed_by`) while it is pending or running; a final
//! status (completed, failed, cancelled) is never overwritten and clears the holder.

use super::runs::unheld_by;
use super::{on_pool, opt_text, text, Store, StoreRow};
use crate::api::error::GatewayError;
use crate::api::tenancy::Tenant;

/// One saved graph.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GraphRow {
    pub owner: String,
    pub id: String,
    pub label: String,
    pub agent_id: Option<String>,
    /// The graph as JSON text; the store never reads inside it.
    pub definition: String,
    pub node_count: i64,
    pub created_at: i64,
    pub updated_at: i64,
}

/// One graph run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GraphRunRow {
    pub run_id: String,
    pub owner: String,
    pub definition_id: Option<String>,
    pub label: Option<String>,
    /// pending, running, completed, failed or cancelled.
    pub status: String,
    pub node_count: i64,
    pub completed_nodes: i64,
    pub failed_nodes: i64,
    pub artifact_count: i64,
    pub created_at: i64,
    pub started_at: Option<i64>,
    pub completed_at: Option<i64>,
    pub error: Option<String>,
    /// Each node's state as JSON text; the store never reads inside it.
    pub nodes: String,
    pub cancel_requested: bool,
}

/// What [`Store::graph_run_delete`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunDeletion {
    /// The run had ended and is gone.
    Deleted,
    /// The run is pending or running: kept.
    Live,
    /// No such run within reach.
    Missing,
}

/// Most rows [`Store::graph_runs_recent`] answers.
const RECENT_MAX: i64 = 1000;

const GRAPH_COLUMNS: &str =
    "owner, id, label, agent_id, definition, node_count, created_at, updated_at";

const RUN_COLUMNS: &str = "run_id, owner, definition_id, label, status, node_count, \
     completed_nodes, failed_nodes, artifact_count, created_at, started_at, completed_at, error, \
     nodes, cancel_requested";

fn graph_row(r: &impl StoreRow) -> Result<GraphRow, sqlx::Error> {
    Ok(GraphRow {
        owner: r.col("owner")?,
        id: r.col("id")?,
        label: r.col("label")?,
        agent_id: r.col("agent_id")?,
        definition: r.col("definition")?,
        node_count: r.col("node_count")?,
        created_at: r.col("created_at")?,
        updated_at: r.col("updated_at")?,
    })
}

fn run_row(r: &impl StoreRow) -> Result<GraphRunRow, sqlx::Error> {
    Ok(GraphRunRow {
        run_id: r.col("run_id")?,
        owner: r.col("owner")?,
        definition_id: r.col("definition_id")?,
        label: r.col("label")?,
        status: r.col("status")?,
        node_count: r.col("node_count")?,
        completed_nodes: r.col("completed_nodes")?,
        failed_nodes: r.col("failed_nodes")?,
        artifact_count: r.col("artifact_count")?,
        created_at: r.col("created_at")?,
        started_at: r.col("started_at")?,
        completed_at: r.col("completed_at")?,
        error: r.col("error")?,
        nodes: r.col("nodes")?,
        cancel_requested: r.col::<i64>("cancel_requested")? != 0,
    })
}

/// A concurrent delete can slip between the update and the insert of a save; this many
/// rounds of the pair before giving up.
const SAVE_ATTEMPTS: usize = 3;

impl Store {
    // ------------------------------------------------------------------ saved graphs

    /// Inserts or replaces (owner, id); an update keeps created_at. True when it was created.
    pub async fn graph_save(&self, row: &GraphRow) -> Result<bool, GatewayError> {
        for _ in 0..SAVE_ATTEMPTS {
            let updated = on_pool!(self.pool(), |p| {
                sqlx::query(
                    "UPDATE graphs SET label = $1, agent_id = $2, definition = $3, \
                     node_count = $4, updated_at = $5 WHERE owner = $6 AND id = $7",
                )
                .bind(text(&row.label))
                .bind(&row.agent_id)
                .bind(text(&row.definition))
                .bind(row.node_count)
                .bind(row.updated_at)
                .bind(&row.owner)
                .bind(&row.id)
                .execute(p)
                .await?
                .rows_affected()
            });
            if updated > 0 {
                return Ok(false);
            }
            // Of two saves creating one graph, one inserts and the other updates next round.
            let inserted = on_pool!(self.pool(), |p| {
                sqlx::query(
                    "INSERT INTO graphs (owner, id, label, agent_id, definition, node_count, \
                     created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
                     ON CONFLICT (owner, id) DO NOTHING",
                )
                .bind(&row.owner)
                .bind(&row.id)
                .bind(text(&row.label))
                .bind(&row.agent_id)
                .bind(text(&row.definition))
                .bind(row.node_count)
                .bind(row.created_at)
                .bind(row.updated_at)
                .execute(p)
                .await?
                .rows_affected()
            });
            if inserted > 0 {
                return Ok(true);
            }
        }
        Err(GatewayError::Conflict(format!(
            "The graph {} changed while it was being saved; try again",
            row.id
        )))
    }

    /// The graph `id` of `owner`.
    pub async fn graph_get(&self, owner: &str, id: &str) -> Result<Option<GraphRow>, GatewayError> {
        let sql = format!("SELECT {GRAPH_COLUMNS} FROM graphs WHERE owner = $1 AND id = $2");
        Ok(on_pool!(self.pool(), |p| {
            let row = sqlx::query(&sql)
                .bind(owner)
                .bind(id)
                .fetch_optional(p)
                .await?;
            row.as_ref().map(graph_row).transpose()?
        }))
    }

    /// One owner's graphs, most recently updated first (ties: id), and the owner's total.
    pub async fn graph_list(
        &self,
        owner: &str,
        limit: i64,
        offset: i64,
    ) -> Result<(Vec<GraphRow>, i64), GatewayError> {
        let sql = format!(
            "SELECT {GRAPH_COLUMNS} FROM graphs WHERE owner = $1 \
             ORDER BY updated_at DESC, id LIMIT $2 OFFSET $3"
        );
        let rows = on_pool!(self.pool(), |p| {
            let rows = sqlx::query(&sql)
                .bind(owner)
                .bind(limit.max(0))
                .bind(offset.max(0))
                .fetch_all(p)
                .await?;
            rows.iter().map(graph_row).collect::<Result<Vec<_>, _>>()?
        });
        Ok((rows, self.graph_count(owner).await?))
    }

    /// Deletes the graph `id` of `owner`; false when there was none.
    pub async fn graph_delete(&self, owner: &str, id: &str) -> Result<bool, GatewayError> {
        Ok(on_pool!(self.pool(), |p| sqlx::query(
            "DELETE FROM graphs WHERE owner = $1 AND id = $2"
        )
        .bind(owner)
        .bind(id)
        .execute(p)
        .await?
        .rows_affected())
            > 0)
    }

    /// How many graphs `owner` has saved.
    pub async fn graph_count(&self, owner: &str) -> Result<i64, GatewayError> {
        Ok(on_pool!(self.pool(), |p| sqlx::query_scalar::<_, i64>(
            "SELECT COUNT(*) FROM graphs WHERE owner = $1"
        )
        .bind(owner)
        .fetch_one(p)
        .await?))
    }

    // ------------------------------------------------------------------ graph runs

    /// Inserts a run held by this node (claimed_by = self.node()). A run inserted already
    /// final is held by nobody, as a final status leaves it.
    pub async fn graph_run_insert(&self, row: &GraphRunRow) -> Result<(), GatewayError> {
        on_pool!(self.pool(), |p| {
            sqlx::query(
                "INSERT INTO graph_runs (run_id, owner, definition_id, label, status, \
                 node_count, completed_nodes, failed_nodes, artifact_count, created_at, \
                 started_at, completed_at, error, nodes, claimed_by, cancel_requested) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, \
                 CASE WHEN $5 IN ('pending', 'running') THEN $15 ELSE NULL END, $16)",
            )
            .bind(&row.run_id)
            .bind(&row.owner)
            .bind(&row.definition_id)
            .bind(opt_text(&row.label))
            .bind(&row.status)
            .bind(row.node_count)
            .bind(row.completed_nodes)
            .bind(row.failed_nodes)
            .bind(row.artifact_count)
            .bind(row.created_at)
            .bind(row.started_at)
            .bind(row.completed_at)
            .bind(opt_text(&row.error))
            .bind(text(&row.nodes))
            .bind(self.node())
            .bind(i64::from(row.cancel_requested))
            .execute(p)
            .await
            .map(drop)
        })?;
        Ok(())
    }

    /// Writes status, counters, started_at, completed_at, error and nodes of row.run_id (never
    /// owner, cancel_requested). When the stored status is already final (completed|failed|
    /// cancelled) it changes nothing and answers false; else true (false too for an unknown
    /// run). A final status clears claimed_by.
    pub async fn graph_run_update(&self, row: &GraphRunRow) -> Result<bool, GatewayError> {
        let changed = on_pool!(self.pool(), |p| {
            sqlx::query(
                "UPDATE graph_runs SET status = $1, node_count = $2, completed_nodes = $3, \
                 failed_nodes = $4, artifact_count = $5, started_at = $6, completed_at = $7, \
                 error = $8, nodes = $9, \
                 claimed_by = CASE WHEN $1 IN ('pending', 'running') THEN claimed_by ELSE NULL END \
                 WHERE run_id = $10 AND status IN ('pending', 'running')",
            )
            .bind(&row.status)
            .bind(row.node_count)
            .bind(row.completed_nodes)
            .bind(row.failed_nodes)
            .bind(row.artifact_count)
            .bind(row.started_at)
            .bind(row.completed_at)
            .bind(opt_text(&row.error))
            .bind(text(&row.nodes))
            .bind(&row.run_id)
            .execute(p)
            .await?
            .rows_affected()
        });
        Ok(changed > 0)
    }

    /// The run when `tenant` reaches its owner (Tenant::only(): None = admin reaches all).
    pub async fn graph_run_get(
        &self,
        tenant: &Tenant,
        run_id: &str,
    ) -> Result<Option<GraphRunRow>, GatewayError> {
        let sql = format!(
            "SELECT {RUN_COLUMNS} FROM graph_runs WHERE run_id = $1 AND ($2 IS NULL OR owner = $2)"
        );
        Ok(on_pool!(self.pool(), |p| {
            let row = sqlx::query(&sql)
                .bind(run_id)
                .bind(tenant.only())
                .fetch_optional(p)
                .await?;
            row.as_ref().map(run_row).transpose()?
        }))
    }

    /// Stored runs newest first (created_at DESC, run_id DESC) and the total, within reach of
    /// tenant.
    pub async fn graph_runs_list(
        &self,
        tenant: &Tenant,
        limit: i64,
        offset: i64,
    ) -> Result<(Vec<GraphRunRow>, i64), GatewayError> {
        let sql = format!(
            "SELECT {RUN_COLUMNS} FROM graph_runs WHERE ($1 IS NULL OR owner = $1) \
             ORDER BY created_at DESC, run_id DESC LIMIT $2 OFFSET $3"
        );
        Ok(on_pool!(self.pool(), |p| {
            let rows = sqlx::query(&sql)
                .bind(tenant.only())
                .bind(limit.max(0))
                .bind(offset.max(0))
                .fetch_all(p)
                .await?;
            let total: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM graph_runs WHERE ($1 IS NULL OR owner = $1)",
            )
            .bind(tenant.only())
            .fetch_one(p)
            .await?;
            (
                rows.iter().map(run_row).collect::<Result<Vec<_>, _>>()?,
                total,
            )
        }))
    }

    /// Runs still pending or running plus those that ended at or after since_ms, newest first,
    /// within reach (at most 1,000).
    pub async fn graph_runs_recent(
        &self,
        tenant: &Tenant,
        since_ms: i64,
    ) -> Result<Vec<GraphRunRow>, GatewayError> {
        let sql = format!(
            "SELECT {RUN_COLUMNS} FROM graph_runs \
             WHERE (status IN ('pending', 'running') OR completed_at >= $1) \
             AND ($2 IS NULL OR owner = $2) ORDER BY created_at DESC, run_id DESC LIMIT $3"
        );
        Ok(on_pool!(self.pool(), |p| {
            let rows = sqlx::query(&sql)
                .bind(since_ms)
                .bind(tenant.only())
                .bind(RECENT_MAX)
                .fetch_all(p)
                .await?;
            rows.iter().map(run_row).collect::<Result<Vec<_>, _>>()?
        }))
    }

    /// Deletes a final run in one statement (never a pending or running one: Live); Missing
    /// when no row within reach.
    pub async fn graph_run_delete(
        &self,
        tenant: &Tenant,
        run_id: &str,
    ) -> Result<RunDeletion, GatewayError> {
        let deleted = on_pool!(self.pool(), |p| {
            sqlx::query(
                "DELETE FROM graph_runs WHERE run_id = $1 AND ($2 IS NULL OR owner = $2) \
                 AND status NOT IN ('pending', 'running')",
            )
            .bind(run_id)
            .bind(tenant.only())
            .execute(p)
            .await?
            .rows_affected()
        });
        if deleted > 0 {
            return Ok(RunDeletion::Deleted);
        }
        // Nothing deleted: tell a live run from none (the delete above decided; this only reads).
        let kept: Option<String> = on_pool!(self.pool(), |p| {
            sqlx::query_scalar(
                "SELECT run_id FROM graph_runs WHERE run_id = $1 AND ($2 IS NULL OR owner = $2)",
            )
            .bind(run_id)
            .bind(tenant.only())
            .fetch_optional(p)
            .await?
        });
        Ok(match kept {
            Some(_) => RunDeletion::Live,
            None => RunDeletion::Missing,
        })
    }

    /// Deletes the ended runs of `owner` past its newest `keep` (by creation, then id); live
    /// runs are never touched. Answers how many went.
    pub async fn graph_runs_trim(&self, owner: &str, keep: i64) -> Result<u64, GatewayError> {
        Ok(on_pool!(self.pool(), |p| {
            sqlx::query(
                "DELETE FROM graph_runs WHERE owner = $1 AND status NOT IN ('pending', 'running') \
                 AND run_id NOT IN (SELECT run_id FROM graph_runs WHERE owner = $1 \
                 AND status NOT IN ('pending', 'running') \
                 ORDER BY created_at DESC, run_id DESC LIMIT $2)",
            )
            .bind(owner)
            .bind(keep)
            .execute(p)
            .await?
            .rows_affected()
        }))
    }

    /// Marks a live run's cancel request (cancel_requested = true); answers its holder
    /// (claimed_by) when it is live, None otherwise.
    pub async fn graph_run_request_cancel(
        &self,
        run_id: &str,
    ) -> Result<Option<Option<String>>, GatewayError> {
        Ok(on_pool!(self.pool(), |p| {
            sqlx::query_scalar::<_, Option<String>>(
                "UPDATE graph_runs SET cancel_requested = 1 \
                 WHERE run_id = $1 AND status IN ('pending', 'running') RETURNING claimed_by",
            )
            .bind(run_id)
            .fetch_optional(p)
            .await?
        }))
    }

    /// Whether a cancel was requested for the run (false for an unknown run).
    pub async fn graph_run_cancel_requested(&self, run_id: &str) -> Result<bool, GatewayError> {
        let flag: Option<i64> = on_pool!(self.pool(), |p| {
            sqlx::query_scalar("SELECT cancel_requested FROM graph_runs WHERE run_id = $1")
                .bind(run_id)
                .fetch_optional(p)
                .await?
        });
        Ok(flag.is_some_and(|f| f != 0))
    }

    /// Live runs whose holder is gone (the rule of [`Store::runs_orphan_unresumable`]) become
    /// failed, completed_at = now, error "the gateway stopped before the run ended", and held
    /// by nobody. Answers how many.
    pub async fn graph_runs_orphan(
        &self,
        now: i64,
        live_since: Option<i64>,
    ) -> Result<u64, GatewayError> {
        let sql = format!(
            "UPDATE graph_runs SET status = 'failed', completed_at = $3, error = $4, \
             claimed_by = NULL WHERE status IN ('pending', 'running') AND {}",
            unheld_by("claimed_by", 1, 2)
        );
        self.end_unheld(&sql, now, live_since).await
    }

    /// How many pending or running runs `owner` has.
    pub async fn graph_runs_live_count(&self, owner: &str) -> Result<i64, GatewayError> {
        Ok(on_pool!(self.pool(), |p| sqlx::query_scalar::<_, i64>(
            "SELECT COUNT(*) FROM graph_runs WHERE owner = $1 AND status IN ('pending', 'running')"
        )
        .bind(owner)
        .fetch_one(p)
        .await?))
    }
}
