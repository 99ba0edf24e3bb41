//! `heartbeat.*`: per-agent heartbeat settings, their state, and ticks on request.

use super::Rpc;
use crate::api::error::GatewayError;
use crate::api::generated::handlers::HeartbeatApi;
use crate::api::generated::types::{
    HeartbeatActiveHours, HeartbeatConfig, HeartbeatGetParams, HeartbeatGetResult,
    HeartbeatStatesParams, HeartbeatStatesResult, HeartbeatTriggerParams, HeartbeatTriggerResult,
    HeartbeatTriggerResultReason, HeartbeatUpdateParams, HeartbeatUpdateResult,
};
use crate::api::CallContext;
use crate::config::agents::HeartbeatSettings;

impl HeartbeatApi for Rpc {
    async fn get(
        &self,
        _ctx: &CallContext,
        p: HeartbeatGetParams,
    ) -> Result<HeartbeatGetResult, GatewayError> {
        let engine = self.engine();
        let agent = self.agent_or_default(p.agent_id.as_deref())?;
        Ok(HeartbeatGetResult {
            agent_id: agent.id.clone(),
            per_agent: agent.config.heartbeat.clone().unwrap_or_default().into(),
            effective: engine.scheduler.heartbeat_of(&agent).into(),
        })
    }

    async fn states(
        &self,
        _ctx: &CallContext,
        _p: HeartbeatStatesParams,
    ) -> Result<HeartbeatStatesResult, GatewayError> {
        Ok(HeartbeatStatesResult {
            agents: self.engine().scheduler.heartbeat_states().await?,
        })
    }

    async fn trigger(
        &self,
        _ctx: &CallContext,
        p: HeartbeatTriggerParams,
    ) -> Result<HeartbeatTriggerResult, GatewayError> {
        let agent = self.agent_or_default(p.agent_id.as_deref())?.id.clone();
        let triggered = self
            .engine()
            .scheduler
            .heartbeat_wake(&agent, "trigger", None, true)
            .await?;
        Ok(HeartbeatTriggerResult {
            agent_id: agent,
            triggered,
            reason: (!triggered).then_some(HeartbeatTriggerResultReason::AlreadyPending),
        })
    }

    async fn update(
        &self,
        _ctx: &CallContext,
        p: HeartbeatUpdateParams,
    ) -> Result<HeartbeatUpdateResult, GatewayError> {
        let agent = self.agent_or_default(p.agent_id.as_deref())?.id.clone();
        let change = HeartbeatSettings::from(HeartbeatConfig {
            enabled: p.enabled,
            interval_ms: p.interval_ms,
            prompt: p.prompt,
            active_hours: p.active_hours.map(|h| HeartbeatActiveHours {
                start: h.start,
                end: h.end,
                tz: h.tz,
            }),
            model: p.model,
            session: p.session,
            show_ok: p.show_ok,
            show_alerts: p.show_alerts,
            allow_dm: p.allow_dm,
            light_context: p.light_context,
            ack_max_chars: p.ack_max_chars,
            response_prefix: p.response_prefix,
            skip_heartbeat_only_delivery: p.skip_heartbeat_only_delivery,
            alert_threshold: p.alert_threshold,
            alert_cooldown_ms: p.alert_cooldown_ms,
            stale_ms: p.stale_ms,
            target_channel_type: p.target_channel_type,
            target_channel_id: p.target_channel_id,
            target_chat_id: p.target_chat_id,
            target_is_dm: p.target_is_dm,
        });
        let (updated, own) = self
            .engine()
            .scheduler
            .heartbeat_update(&agent, change)
            .await?;
        Ok(HeartbeatUpdateResult {
            agent_id: agent,
            config: own.into(),
            updated,
        })
    }
}
