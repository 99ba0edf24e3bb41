//! `run.kill`: the hard stop of a whole run tree (`docs/orchestration.md`).

use crate::api::error::GatewayError;
use crate::api::generated::handlers::RunApi;
use crate::api::generated::types::{RunKillParams, RunKillResult};
use crate::api::CallContext;

use super::Rpc;

impl RunApi for Rpc {
    async fn kill(
        &self,
        _ctx: &CallContext,
        p: RunKillParams,
    ) -> Result<RunKillResult, GatewayError> {
        let runs = &self.engine().runs;
        let tree = runs.tree();
        let live = tree.tree(&p.root_run_id);
        let (killed, revoked) = tree.kill(&live);
        crate::runtime::tree::ended(&live, super::subagent::KILL_WAIT).await;
        Ok(RunKillResult {
            killed: killed as i64,
            leases_revoked: revoked as i64,
        })
    }
}
