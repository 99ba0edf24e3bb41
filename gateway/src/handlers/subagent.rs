//! `subagent.*`: supervising run trees - listing runs, waiting for them, steering and killing
//! them, and pausing spawns (`docs/orchestration.md`).

use crate::api::error::GatewayError;
use crate::api::generated::handlers::SubagentApi;
use crate::api::generated::types::{
    FinishReason, SubagentKillParams, SubagentKillResult, SubagentListParams, SubagentListResult,
    SubagentPauseParams, SubagentPauseResult, SubagentResumeParams, SubagentResumeResult,
    SubagentRunStatus, SubagentRunSummary, SubagentStatusParams, SubagentStatusResult,
    SubagentSteerParams, SubagentSteerResult, SubagentSteerResultStatus, SubagentWaitParams,
    SubagentWaitResult, SubagentWaitResultResultsItem, SubagentWaitResultResultsItemCompletion,
    SubagentWaitResultResultsItemStatus, TokensUsed,
};
use crate::api::CallContext;
use crate::runtime::runs::Waited;
use crate::store::runs::RunRow;

use super::Rpc;

/// A run's status as stored.
pub(super) fn status_of(s: &str) -> SubagentRunStatus {
    SubagentRunStatus::from_wire(s).unwrap_or(SubagentRunStatus::Failed)
}

fn tokens(r: &RunRow) -> Option<TokensUsed> {
    match (r.input_tokens, r.output_tokens) {
        (Some(input), Some(output)) => Some(TokensUsed {
            input,
            output,
            total: input + output,
        }),
        _ => None,
    }
}

fn summary(r: RunRow, tree: &crate::runtime::tree::RunTree) -> SubagentRunSummary {
    let lease_id = tree.get(&r.run_id).map(|l| l.lease.id.clone());
    let end = r.completed_at.unwrap_or_else(crate::clock::now_ms);
    SubagentRunSummary {
        status: status_of(&r.status),
        runtime_ms: (end - r.started_at).max(0),
        tokens_used: tokens(&r),
        run_id: r.run_id,
        root_run_id: r.root_run_id,
        parent_run_id: r.parent_run_id,
        agent_id: r.agent_id,
        session_key: r.session_key,
        task: r.task,
        depth: r.depth,
        started_at: r.started_at,
        completed_at: r.completed_at,
        cost_usd: r.cost_usd,
        error: r.error,
        lease_id,
    }
}

fn waited(w: Waited) -> SubagentWaitResultResultsItem {
    let status = match w.status() {
        "denied_unknown" => SubagentWaitResultResultsItemStatus::DeniedUnknown,
        "timeout" => SubagentWaitResultResultsItemStatus::Timeout,
        "cancelled" => SubagentWaitResultResultsItemStatus::Cancelled,
        _ => SubagentWaitResultResultsItemStatus::Completed,
    };
    let run_id = w.run_id().to_owned();
    let completion = match w {
        Waited::Ended(r) => Some(SubagentWaitResultResultsItemCompletion {
            status: status_of(&r.status),
            tokens_used: tokens(&r),
            finish_reason: r.finish_reason.as_deref().and_then(FinishReason::from_wire),
            response: r.response,
            cost_usd: r.cost_usd,
            error: r.error,
            completed_at: r.completed_at.unwrap_or_default(),
        }),
        _ => None,
    };
    SubagentWaitResultResultsItem {
        run_id,
        status,
        completion,
    }
}

impl Rpc {
    /// A run the caller reaches, or -32001.
    pub(super) async fn run_row(
        &self,
        ctx: &CallContext,
        id: &str,
    ) -> Result<RunRow, GatewayError> {
        self.engine()
            .store
            .run_get(ctx.tenant(), id)
            .await?
            .ok_or_else(|| GatewayError::not_found("Run", id))
    }
}

impl SubagentApi for Rpc {
    async fn kill(
        &self,
        ctx: &CallContext,
        p: SubagentKillParams,
    ) -> Result<SubagentKillResult, GatewayError> {
        let engine = self.engine();
        let row = self.run_row(ctx, &p.target).await?;
        let (killed, _) = engine
            .runs
            .kill(crate::store::runs::StopScope::Subtree(&row.run_id))
            .await?;
        Ok(SubagentKillResult {
            killed: killed > 0,
            run_id: row.run_id,
        })
    }

    async fn list(
        &self,
        ctx: &CallContext,
        p: SubagentListParams,
    ) -> Result<SubagentListResult, GatewayError> {
        let since = crate::clock::now_ms() - p.recent_minutes.clamp(1, 10_080) * 60_000;
        let engine = self.engine();
        let rows = engine.store.runs_list(ctx.tenant(), since).await?;
        let tree = engine.runs.tree();
        let runs: Vec<_> = rows.into_iter().map(|r| summary(r, tree)).collect();
        Ok(SubagentListResult {
            total: runs.len() as i64,
            runs,
        })
    }

    async fn pause(
        &self,
        _ctx: &CallContext,
        _p: SubagentPauseParams,
    ) -> Result<SubagentPauseResult, GatewayError> {
        let changed = self.engine().runs.set_paused(true).await;
        Ok(SubagentPauseResult {
            paused: true,
            accepting_spawns: false,
            resets_on_restart: true,
            changed,
        })
    }

    async fn resume(
        &self,
        _ctx: &CallContext,
        _p: SubagentResumeParams,
    ) -> Result<SubagentResumeResult, GatewayError> {
        let changed = self.engine().runs.set_paused(false).await;
        Ok(SubagentResumeResult {
            paused: false,
            accepting_spawns: true,
            resets_on_restart: true,
            changed,
        })
    }

    async fn status(
        &self,
        _ctx: &CallContext,
        _p: SubagentStatusParams,
    ) -> Result<SubagentStatusResult, GatewayError> {
        let tree = self.engine().runs.tree();
        let paused = tree.paused();
        let running = tree.all().iter().filter(|r| r.depth > 0).count();
        Ok(SubagentStatusResult {
            paused,
            accepting_spawns: !paused,
            resets_on_restart: true,
            running_runs: running as i64,
            queued_runs: 0,
        })
    }

    async fn steer(
        &self,
        ctx: &CallContext,
        p: SubagentSteerParams,
    ) -> Result<SubagentSteerResult, GatewayError> {
        let engine = self.engine();
        let row = self.run_row(ctx, &p.target).await?;
        if row.completed_at.is_some() || !engine.runs.steer(&row.run_id, p.message).await? {
            return Err(GatewayError::Conflict(format!(
                "Run {} is not running ({})",
                row.run_id, row.status
            )));
        }
        Ok(SubagentSteerResult {
            status: SubagentSteerResultStatus::SteeredInject,
            run_id: row.run_id,
            old_run_id: None,
        })
    }

    async fn wait(
        &self,
        ctx: &CallContext,
        p: SubagentWaitParams,
    ) -> Result<SubagentWaitResult, GatewayError> {
        let ids = p.run_ids.ok_or_else(|| {
            GatewayError::InvalidParams(
                "'runIds' is required: a JSON-RPC caller is not a run, so it has no children"
                    .into(),
            )
        })?;
        let timeout = std::time::Duration::from_millis(p.timeout_ms.clamp(0, 600_000) as u64);
        let results = self.engine().runs.wait(ctx.tenant(), &ids, timeout).await?;
        Ok(SubagentWaitResult {
            results: results.into_iter().map(waited).collect(),
        })
    }
}
