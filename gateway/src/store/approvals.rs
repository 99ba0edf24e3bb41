//! The `approvals` and `approval_denials` tables: tool calls waiting for an operator's
//! decision (`admin.approval.*`), and the denials remembered per (session, tool, arguments)
//! until `admin.approval.clearDenialCache` or `session.reset`. Content-free: a request keeps
//! the tool's name, a summary naming the arguments (never their values) and a digest.

use super::{on_pool, Store, StoreRow};
use crate::api::error::GatewayError;

/// One approval request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ApprovalRow {
    pub id: String,
    pub session_key: String,
    pub agent_id: String,
    pub tool_name: String,
    pub summary: String,
    pub args_digest: String,
    /// Whose turn asked (the session's owner, or the caller of an ephemeral turn).
    pub owner: String,
    pub run_id: Option<String>,
    pub created_at: i64,
    pub expires_at: i64,
    /// pending | approved | denied | expired
    pub status: String,
    pub decided_by: Option<String>,
    pub reason: Option<String>,
    pub decided_at: Option<i64>,
}

fn approval_row(r: &impl StoreRow) -> Result<ApprovalRow, sqlx::Error> {
    Ok(ApprovalRow {
        id: r.col("id")?,
        session_key: r.col("session_key")?,
        agent_id: r.col("agent_id")?,
        tool_name: r.col("tool_name")?,
        summary: r.col("summary")?,
        args_digest: r.col("args_digest")?,
        owner: r.col("owner")?,
        run_id: r.col("run_id")?,
        created_at: r.col("created_at")?,
        expires_at: r.col("expires_at")?,
        status: r.col("status")?,
        decided_by: r.col("decided_by")?,
        reason: r.col("reason")?,
        decided_at: r.col("decided_at")?,
    })
}

impl Store {
    /// Records a pending request.
    pub async fn approval_insert(&self, a: &ApprovalRow) -> Result<(), GatewayError> {
        on_pool!(self.pool(), |p| sqlx::query(
            "INSERT INTO approvals (id, session_key, agent_id, tool_name, summary, args_digest, \
             owner, run_id, created_at, expires_at, status) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, 'pending')"
        )
        .bind(&a.id)
        .bind(&a.session_key)
        .bind(&a.agent_id)
        .bind(&a.tool_name)
        .bind(&a.summary)
        .bind(&a.args_digest)
        .bind(&a.owner)
        .bind(&a.run_id)
        .bind(a.created_at)
        .bind(a.expires_at)
        .execute(p)
        .await
        .map(drop))?;
        Ok(())
    }

    /// One request, whatever its state.
    pub async fn approval_get(&self, id: &str) -> Result<Option<ApprovalRow>, GatewayError> {
        Ok(on_pool!(self.pool(), |p| {
            let row = sqlx::query("SELECT * FROM approvals WHERE id = $1")
                .bind(id)
                .fetch_optional(p)
                .await?;
            row.as_ref().map(approval_row).transpose()?
        }))
    }

    /// Requests still waiting at `now` (of one session when given), oldest first.
    pub async fn approvals_pending(
        &self,
        now: i64,
        session_key: Option<&str>,
    ) -> Result<Vec<ApprovalRow>, GatewayError> {
        Ok(on_pool!(self.pool(), |p| {
            let rows = sqlx::query(
                "SELECT * FROM approvals WHERE status = 'pending' AND expires_at > $1 \
                 AND ($2 IS NULL OR session_key = $2) ORDER BY created_at, id",
            )
            .bind(now)
            .bind(session_key)
            .fetch_all(p)
            .await?;
            rows.iter()
                .map(approval_row)
                .collect::<Result<Vec<_>, _>>()?
        }))
    }

    /// Decides a request still waiting at `now`: approved or denied, by whom, why. None when
    /// it is unknown, already decided or lapsed (nothing changes then).
    pub async fn approval_decide(
        &self,
        id: &str,
        approved: bool,
        by: &str,
        reason: Option<&str>,
        now: i64,
    ) -> Result<Option<ApprovalRow>, GatewayError> {
        let status = if approved { "approved" } else { "denied" };
        Ok(on_pool!(self.pool(), |p| {
            let row = sqlx::query(
                "UPDATE approvals SET status = $1, decided_by = $2, reason = $3, decided_at = $4 \
                 WHERE id = $5 AND status = 'pending' AND expires_at > $4 RETURNING *",
            )
            .bind(status)
            .bind(by)
            .bind(reason)
            .bind(now)
            .bind(id)
            .fetch_optional(p)
            .await?;
            row.as_ref().map(approval_row).transpose()?
        }))
    }

    /// Marks a request that was not decided in time as lapsed; false when it was decided.
    pub async fn approval_lapse(&self, id: &str, now: i64) -> Result<bool, GatewayError> {
        Ok(on_pool!(self.pool(), |p| sqlx::query(
            "UPDATE approvals SET status = 'expired', decided_at = $1 \
             WHERE id = $2 AND status = 'pending'"
        )
        .bind(now)
        .bind(id)
        .execute(p)
        .await?
        .rows_affected())
            > 0)
    }

    /// Remembers a denial of `tool` with these arguments in this session.
    pub async fn denial_remember(
        &self,
        session_key: &str,
        tool: &str,
        digest: &str,
        reason: Option<&str>,
        now: i64,
    ) -> Result<(), GatewayError> {
        on_pool!(self.pool(), |p| {
            sqlx::query(
            "INSERT INTO approval_denials (session_key, tool_name, args_digest, reason, created_at) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (session_key, tool_name, args_digest) \
             DO UPDATE SET reason = excluded.reason, created_at = excluded.created_at"
        )
        .bind(session_key)
        .bind(tool)
        .bind(digest)
        .bind(reason)
        .bind(now)
        .execute(p)
        .await
        .map(drop)
        })?;
        Ok(())
    }

    /// A remembered denial: Some(reason given, if any).
    pub async fn denial_get(
        &self,
        session_key: &str,
        tool: &str,
        digest: &str,
    ) -> Result<Option<Option<String>>, GatewayError> {
        Ok(on_pool!(self.pool(), |p| sqlx::query_scalar(
            "SELECT reason FROM approval_denials WHERE session_key = $1 AND tool_name = $2 \
             AND args_digest = $3"
        )
        .bind(session_key)
        .bind(tool)
        .bind(digest)
        .fetch_optional(p)
        .await?))
    }

    /// Forgets remembered denials: every one, or one session's.
    pub async fn denials_clear(&self, session_key: Option<&str>) -> Result<u64, GatewayError> {
        Ok(on_pool!(self.pool(), |p| sqlx::query(
            "DELETE FROM approval_denials WHERE ($1 IS NULL OR session_key = $1)"
        )
        .bind(session_key)
        .execute(p)
        .await?
        .rows_affected()))
    }
}
