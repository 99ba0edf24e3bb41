//! The `runs` table: runs started in the background (session.spawn, session.send async) and
//! their outcome, readable with session.run_status after the run and across restarts.

use sqlx::sqlite::SqliteRow;
use sqlx::Row;

use super::Store;
use crate::error::GatewayError;
use crate::tenancy::Tenant;

/// One run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunRow {
    pub run_id: String,
    pub root_run_id: String,
    pub parent_run_id: Option<String>,
    pub agent_id: String,
    pub session_key: String,
    pub task: String,
    pub status: String,
    pub depth: i64,
    pub client_id: String,
    pub started_at: i64,
    pub completed_at: Option<i64>,
    pub response: Option<String>,
    pub input_tokens: Option<i64>,
    pub output_tokens: Option<i64>,
    pub cost_usd: Option<f64>,
    pub finish_reason: Option<String>,
    pub error: Option<String>,
    /// Where the answer goes (JSON `{deliver, channel, to}`), for runs started by webhooks.
    pub delivery: Option<String>,
}

fn run_row(r: &SqliteRow) -> Result<RunRow, sqlx::Error> {
    Ok(RunRow {
        run_id: r.try_get("run_id")?,
        root_run_id: r.try_get("root_run_id")?,
        parent_run_id: r.try_get("parent_run_id")?,
        agent_id: r.try_get("agent_id")?,
        session_key: r.try_get("session_key")?,
        task: r.try_get("task")?,
        status: r.try_get("status")?,
        depth: r.try_get("depth")?,
        client_id: r.try_get("client_id")?,
        started_at: r.try_get("started_at")?,
        completed_at: r.try_get("completed_at")?,
        response: r.try_get("response")?,
        input_tokens: r.try_get("input_tokens")?,
        output_tokens: r.try_get("output_tokens")?,
        cost_usd: r.try_get("cost_usd")?,
        finish_reason: r.try_get("finish_reason")?,
        error: r.try_get("error")?,
        delivery: r.try_get("delivery")?,
    })
}

impl Store {
    pub async fn run_insert(&self, r: &RunRow) -> Result<(), GatewayError> {
        sqlx::query(
            "INSERT INTO runs (run_id, root_run_id, parent_run_id, agent_id, session_key, task, status, \
             depth, client_id, started_at, delivery) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(&r.run_id)
        .bind(&r.root_run_id)
        .bind(&r.parent_run_id)
        .bind(&r.agent_id)
        .bind(&r.session_key)
        .bind(&r.task)
        .bind(&r.status)
        .bind(r.depth)
        .bind(&r.client_id)
        .bind(r.started_at)
        .bind(&r.delivery)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// Records the end of a run.
    pub async fn run_finish(&self, r: &RunRow) -> Result<(), GatewayError> {
        sqlx::query(
            "UPDATE runs SET status = ?, completed_at = ?, response = ?, input_tokens = ?, \
             output_tokens = ?, cost_usd = ?, finish_reason = ?, error = ? WHERE run_id = ?",
        )
        .bind(&r.status)
        .bind(r.completed_at)
        .bind(&r.response)
        .bind(r.input_tokens)
        .bind(r.output_tokens)
        .bind(r.cost_usd)
        .bind(&r.finish_reason)
        .bind(&r.error)
        .bind(&r.run_id)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// The run `run_id` when `tenant` reaches it (its starting client's, or admin).
    pub async fn run_get(
        &self,
        tenant: &Tenant,
        run_id: &str,
    ) -> Result<Option<RunRow>, GatewayError> {
        let row =
            sqlx::query("SELECT * FROM runs WHERE run_id = ?1 AND (?2 IS NULL OR client_id = ?2)")
                .bind(run_id)
                .bind(tenant.only())
                .fetch_optional(self.pool())
                .await?;
        Ok(row.as_ref().map(run_row).transpose()?)
    }

    /// Runs left queued or running by a previous process become orphaned.
    pub async fn runs_orphan_unfinished(&self, now: i64) -> Result<u64, GatewayError> {
        let done = sqlx::query(
            "UPDATE runs SET status = 'orphaned', completed_at = ?, error = 'the gateway stopped before the run ended' \
             WHERE status IN ('queued', 'running')",
        )
        .bind(now)
        .execute(self.pool())
        .await?;
        Ok(done.rows_affected())
    }
}
