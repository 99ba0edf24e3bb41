//! `scheduler.wake`: the heartbeat coalescer, on request, within the caller's wake budget.

use super::Rpc;
use crate::api::error::GatewayError;
use crate::api::generated::handlers::SchedulerApi;
use crate::api::generated::methods::Scope;
use crate::api::generated::types::{
    SchedulerWakeParams, SchedulerWakeResult, SchedulerWakeResultReason,
};
use crate::api::CallContext;

impl SchedulerApi for Rpc {
    async fn wake(
        &self,
        ctx: &CallContext,
        p: SchedulerWakeParams,
    ) -> Result<SchedulerWakeResult, GatewayError> {
        // Admin may run heartbeat turns at will (heartbeat.trigger); everyone else has a
        // budget, spent first so that every call reaching the handler counts, refused ones too.
        let admin = ctx.allows(Scope::Admin);
        if !admin {
            self.state.control.limits.scheduler_wake(&ctx.client_id)?;
        }
        let engine = self.engine();
        let agent = self.agent_or_default(p.agent_id.as_deref())?;
        // A disabled heartbeat is the operator's decision: only admin runs its turn anyway.
        if !admin && engine.scheduler.heartbeat_of(&agent).enabled != Some(true) {
            return Ok(SchedulerWakeResult {
                woke: false,
                reason: Some(SchedulerWakeResultReason::HeartbeatDisabled),
                source: p.source,
            });
        }
        // The catalogue's pattern has made `source` a short label; it is recorded, never
        // placed in the tick's prompt (beat.rs).
        let woke = engine
            .scheduler
            .heartbeat_wake(&agent.id, &p.source, None, false)
            .await?;
        Ok(SchedulerWakeResult {
            woke,
            reason: (!woke).then_some(SchedulerWakeResultReason::Coalesced),
            source: p.source,
        })
    }
}
