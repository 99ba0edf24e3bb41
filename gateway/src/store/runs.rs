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

/// A queued run that can be started again after a restart: its row and the JSON of what it
/// needs besides (see `runs.resume`).
#[derive(Debug, Clone, PartialEq)]
pub struct ResumableRun {
    pub row: RunRow,
    pub resume: String,
}

/// Whether a webhook delivery was new.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// Not seen within its window: recorded now.
    First,
    /// Seen and not expired: a replay.
    Repeat,
}

impl Store {
    /// Inserts a queued run with what it needs to be resumed, held by `process`. Committed
    /// before it returns, so an acknowledgement sent after it survives a killed process.
    pub async fn run_insert_queued(
        &self,
        r: &RunRow,
        resume: &str,
        process: &str,
    ) -> Result<(), GatewayError> {
        sqlx::query(
            "INSERT INTO runs (run_id, root_run_id, parent_run_id, agent_id, session_key, task, status, \
             depth, client_id, started_at, delivery, resume, claimed_by) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
        .bind(resume)
        .bind(process)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// A queued run starts: `running` from `now`.
    pub async fn run_mark_running(&self, run_id: &str, now: i64) -> Result<(), GatewayError> {
        sqlx::query("UPDATE runs SET status = 'running', started_at = ? WHERE run_id = ?")
            .bind(now)
            .bind(run_id)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    /// Takes over the resumable queued runs no live part of `process` holds (left by a
    /// previous process), oldest first. Each is taken once: a second call from the same
    /// process finds none.
    pub async fn runs_claim_queued(
        &self,
        process: &str,
    ) -> Result<Vec<ResumableRun>, GatewayError> {
        let rows = sqlx::query(
            "UPDATE runs SET claimed_by = ? WHERE status = 'queued' AND resume IS NOT NULL \
             AND (claimed_by IS NULL OR claimed_by <> ?) RETURNING *",
        )
        .bind(process)
        .bind(process)
        .fetch_all(self.pool())
        .await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            out.push(ResumableRun {
                row: run_row(r)?,
                resume: r.try_get("resume")?,
            });
        }
        out.sort_by(|a, b| {
            (a.row.started_at, &a.row.run_id).cmp(&(b.row.started_at, &b.row.run_id))
        });
        Ok(out)
    }

    /// Like `runs_orphan_unfinished`, but queued runs that can be resumed are left queued:
    /// running ones, and queued ones without a resume record, become orphaned.
    pub async fn runs_orphan_unresumable(&self, now: i64) -> Result<u64, GatewayError> {
        let done = sqlx::query(
            "UPDATE runs SET status = 'orphaned', completed_at = ?, error = 'the gateway stopped before the run ended' \
             WHERE status = 'running' OR (status = 'queued' AND resume IS NULL)",
        )
        .bind(now)
        .execute(self.pool())
        .await?;
        Ok(done.rows_affected())
    }

    /// Records a signed webhook delivery unless it was seen and has not expired; expired
    /// entries are swept on the way, and past `capacity` entries the soonest to expire go.
    pub async fn webhook_delivery_seen(
        &self,
        delivery: &str,
        now: i64,
        expires_at: i64,
        capacity: i64,
    ) -> Result<Delivery, GatewayError> {
        let mut tx = self.pool().begin().await?;
        sqlx::query("DELETE FROM webhook_deliveries WHERE expires_at <= ?")
            .bind(now)
            .execute(&mut *tx)
            .await?;
        let inserted = sqlx::query(
            "INSERT INTO webhook_deliveries (delivery, expires_at) VALUES (?, ?) \
             ON CONFLICT (delivery) DO NOTHING",
        )
        .bind(delivery)
        .bind(expires_at)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if inserted == 0 {
            tx.commit().await?;
            return Ok(Delivery::Repeat);
        }
        // Bounded: beyond capacity, forget the entries closest to expiring (never this one).
        sqlx::query(
            "DELETE FROM webhook_deliveries WHERE delivery IN (SELECT delivery FROM webhook_deliveries \
             WHERE delivery <> ? ORDER BY expires_at LIMIT MAX(0, (SELECT COUNT(*) FROM webhook_deliveries) - ?))",
        )
        .bind(delivery)
        .bind(capacity.max(1))
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Delivery::First)
    }

    /// Forgets a delivery (its run could not be queued: a redelivery must run).
    pub async fn webhook_delivery_forget(&self, delivery: &str) -> Result<(), GatewayError> {
        sqlx::query("DELETE FROM webhook_deliveries WHERE delivery = ?")
            .bind(delivery)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    /// How many deliveries are remembered (tests, diagnostics).
    pub async fn webhook_deliveries_count(&self) -> Result<i64, GatewayError> {
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM webhook_deliveries")
            .fetch_one(self.pool())
            .await?;
        Ok(n)
    }
}

#[cfg(test)]
mod durability_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    async fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("t.db")).await.unwrap();
        (dir, store)
    }

    fn queued(id: &str, at: i64) -> RunRow {
        RunRow {
            run_id: id.into(),
            root_run_id: id.into(),
            agent_id: "a".into(),
            session_key: "agent:a:webhook:m:x".into(),
            task: "t".into(),
            status: "queued".into(),
            client_id: "webhook:m".into(),
            started_at: at,
            ..RunRow::default()
        }
    }

    #[tokio::test]
    async fn deliveries_repeat_until_they_expire_and_stay_bounded() {
        let (_d, s) = store().await;
        assert_eq!(
            s.webhook_delivery_seen("a", 0, 100, 3).await.unwrap(),
            Delivery::First
        );
        assert_eq!(
            s.webhook_delivery_seen("a", 99, 199, 3).await.unwrap(),
            Delivery::Repeat
        );
        // At its expiry it is swept and counts as new again.
        assert_eq!(
            s.webhook_delivery_seen("a", 100, 200, 3).await.unwrap(),
            Delivery::First
        );
        // Capacity 3: a fourth live entry pushes out the one closest to expiring.
        for (d, exp) in [("b", 300), ("c", 400)] {
            assert_eq!(
                s.webhook_delivery_seen(d, 101, exp, 3).await.unwrap(),
                Delivery::First
            );
        }
        assert_eq!(s.webhook_deliveries_count().await.unwrap(), 3);
        assert_eq!(
            s.webhook_delivery_seen("d", 101, 500, 3).await.unwrap(),
            Delivery::First
        );
        assert_eq!(s.webhook_deliveries_count().await.unwrap(), 3);
        assert_eq!(
            s.webhook_delivery_seen("a", 101, 600, 3).await.unwrap(),
            Delivery::First
        );
        assert_eq!(
            s.webhook_delivery_seen("d", 101, 700, 3).await.unwrap(),
            Delivery::Repeat
        );
        s.webhook_delivery_forget("d").await.unwrap();
        assert_eq!(
            s.webhook_delivery_seen("d", 101, 700, 3).await.unwrap(),
            Delivery::First
        );
    }

    #[tokio::test]
    async fn queued_runs_are_claimed_once_per_process_and_kept_by_the_sweep() {
        let (_d, s) = store().await;
        s.run_insert_queued(&queued("r2", 2), "{}", "p1")
            .await
            .unwrap();
        s.run_insert_queued(&queued("r1", 1), "{}", "p1")
            .await
            .unwrap();
        s.run_insert(&queued("plain", 3)).await.unwrap();
        let mut running = queued("busy", 4);
        running.status = "running".into();
        s.run_insert(&running).await.unwrap();
        assert_eq!(s.runs_orphan_unresumable(10).await.unwrap(), 2);
        assert_eq!(
            s.run_get(
                &crate::tenancy::Tenant::for_principal("admin", true),
                "plain"
            )
            .await
            .unwrap()
            .unwrap()
            .status,
            "orphaned"
        );
        assert_eq!(
            s.run_get(
                &crate::tenancy::Tenant::for_principal("admin", true),
                "busy"
            )
            .await
            .unwrap()
            .unwrap()
            .status,
            "orphaned"
        );
        // The process that queued them does not take them again; the next one does, once.
        assert!(s.runs_claim_queued("p1").await.unwrap().is_empty());
        let claimed = s.runs_claim_queued("p2").await.unwrap();
        let ids: Vec<&str> = claimed.iter().map(|c| c.row.run_id.as_str()).collect();
        assert_eq!(ids, ["r1", "r2"]);
        assert_eq!(claimed[0].resume, "{}");
        assert!(s.runs_claim_queued("p2").await.unwrap().is_empty());
        s.run_mark_running("r1", 20).await.unwrap();
        assert!(s.runs_claim_queued("p3").await.unwrap().len() == 1);
    }
}
