//! `scheduler.wake`: the heartbeat coalescer, on request.

use super::Rpc;
use crate::error::GatewayError;
use crate::rpc::generated::handlers::SchedulerApi;
use crate::rpc::generated::types::{SchedulerWakeParams, SchedulerWakeResult};
use crate::rpc::CallContext;

impl SchedulerApi for Rpc {
    async fn wake(
        &self,
        _ctx: &CallContext,
        p: SchedulerWakeParams,
    ) -> Result<SchedulerWakeResult, GatewayError> {
        let engine = self.engine();
        let agent = self.agent_or_default(p.agent_id.as_deref())?.id.clone();
        let woke = engine
            .heartbeat_wake(&agent, &p.source, None, false)
            .await?;
        Ok(SchedulerWakeResult {
            woke,
            source: p.source,
        })
    }
}
