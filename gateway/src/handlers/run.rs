//! `run.kill`: the hard stop of a whole run tree, whichever node runs it
//! (`docs/orchestration.md`).

use crate::api::error::GatewayError;
use crate::api::generated::handlers::RunApi;
use crate::api::generated::types::{RunKillParams, RunKillResult};
use crate::api::CallContext;
use crate::store::runs::StopScope;

use super::Rpc;

impl RunApi for Rpc {
    async fn kill(
        &self,
        _ctx: &CallContext,
        p: RunKillParams,
    ) -> Result<RunKillResult, GatewayError> {
        // A graph's root held by another node has no runs row: its executor learns of the
        // kill from a stored cancel request, written before the kill of its node runs.
        self.engine().graphs.kill_requested(&p.root_run_id).await?;
        let (killed, revoked) = self
            .engine()
            .runs
            .kill(StopScope::Tree(&p.root_run_id))
            .await?;
        Ok(RunKillResult {
            killed: killed as i64,
            leases_revoked: revoked as i64,
        })
    }
}
