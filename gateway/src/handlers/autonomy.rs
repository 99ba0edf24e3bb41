//! `autonomy.evict`: drops a run tree to the `default` profile at its next gate decision,
//! without stopping it (`docs/orchestration.md`, "Profiles and eviction").

use crate::api::error::GatewayError;
use crate::api::generated::handlers::AutonomyApi;
use crate::api::generated::types::{AutonomyEvictParams, AutonomyEvictResult};
use crate::api::CallContext;

use super::Rpc;

impl AutonomyApi for Rpc {
    async fn evict(
        &self,
        _ctx: &CallContext,
        p: AutonomyEvictParams,
    ) -> Result<AutonomyEvictResult, GatewayError> {
        let already = self.engine().runs.evict(&p.root_run_id).await;
        Ok(AutonomyEvictResult {
            evicted: true,
            root_run_id: p.root_run_id,
            already_evicted: already,
        })
    }
}
