//! `agents.*`: listing, creating, reading, updating, deleting, suspending and resuming agents.

use super::Rpc;
use crate::api::error::GatewayError;
use crate::api::generated::handlers::AgentsApi;
use crate::api::generated::types::{
    AgentsCreateParams, AgentsCreateResult, AgentsDeleteParams, AgentsDeleteResult,
    AgentsGetParams, AgentsListParams, AgentsListResult, AgentsRecord, AgentsResumeParams,
    AgentsResumeResult, AgentsSuspendParams, AgentsSuspendResult, AgentsUpdateParams,
    AgentsUpdateResult,
};
use crate::api::CallContext;
use crate::config::agents::AgentSettings;
use crate::runtime::agents::{workspace_dir, Agent};

impl Rpc {
    /// The wire record of an agent, built from its (completed) domain settings.
    fn agent_record(&self, agent: &Agent) -> AgentsRecord {
        let engine = self.engine();
        let is_default = engine.agents.default_id().as_deref() == Some(agent.id.as_str());
        let c = &agent.config;
        AgentsRecord {
            agent_id: agent.id.clone(),
            name: c.name.clone().unwrap_or_else(|| agent.id.clone()),
            provider: c.provider.clone().unwrap_or_default(),
            model: agent.model().to_owned(),
            system_prompt: c.system_prompt.clone().unwrap_or_default(),
            max_steps: i64::from(agent.max_steps()),
            budget: agent.budget().into(),
            tools: c.tools.clone().unwrap_or_default(),
            fallback_models: c.fallback_models.clone().unwrap_or_default(),
            operation_models: c.operation_models.clone().unwrap_or_default(),
            suspended: agent.suspended,
            is_default,
            workspace_dir: workspace_dir(&engine.data_dir, &agent.id)
                .display()
                .to_string(),
            created_at: agent.created_at,
            updated_at: agent.updated_at,
        }
    }
}

/// A heartbeat given with an agent's settings runs in a heartbeat session of that agent.
fn check_heartbeat(id: &str, config: &AgentSettings) -> Result<(), GatewayError> {
    if let Some(h) = &config.heartbeat {
        crate::runtime::scheduler::beat::check(id, h)
            .map_err(|e| GatewayError::InvalidParams(format!("config.heartbeat.{e}")))?;
    }
    Ok(())
}

/// Heartbeat ticks follow the agents' settings (best effort: the timer resynchronises at the
/// next start too).
async fn resync_heartbeats(engine: &std::sync::Arc<crate::runtime::engine::Engine>) {
    if let Err(e) = engine.scheduler.sync_heartbeats().await {
        tracing::warn!(error = %e, "heartbeat schedules not synchronised");
    }
}

impl AgentsApi for Rpc {
    async fn list(
        &self,
        _ctx: &CallContext,
        _p: AgentsListParams,
    ) -> Result<AgentsListResult, GatewayError> {
        let agents = &self.engine().agents;
        Ok(AgentsListResult {
            agents: agents.ids(),
            default_agent_id: agents.default_id(),
        })
    }

    async fn get(
        &self,
        _ctx: &CallContext,
        p: AgentsGetParams,
    ) -> Result<AgentsRecord, GatewayError> {
        let agent = self.engine().agents.require(&p.agent_id)?;
        Ok(self.agent_record(&agent))
    }

    async fn create(
        &self,
        _ctx: &CallContext,
        p: AgentsCreateParams,
    ) -> Result<AgentsCreateResult, GatewayError> {
        let engine = self.engine();
        let snap = engine.providers.snapshot();
        let config = p.config.map(AgentSettings::from).unwrap_or_default();
        check_heartbeat(&p.agent_id, &config)?;
        let default_model = engine.default_chat_model();
        let agent = engine
            .agents
            .create(&p.agent_id, config, &snap, default_model.as_deref())
            .await?;
        resync_heartbeats(engine).await;
        let dir = workspace_dir(&engine.data_dir, &agent.id);
        if let Err(e) = std::fs::create_dir_all(&dir) {
            tracing::warn!(agent = %agent.id, error = %e, "workspace directory not created");
        }
        engine.emit("agent:hot_added", serde_json::json!({"agentId": agent.id}));
        Ok(AgentsCreateResult {
            agent_id: agent.id.clone(),
            created: true,
            agent: self.agent_record(&agent),
        })
    }

    async fn update(
        &self,
        _ctx: &CallContext,
        p: AgentsUpdateParams,
    ) -> Result<AgentsUpdateResult, GatewayError> {
        let engine = self.engine();
        let snap = engine.providers.snapshot();
        let change: AgentSettings = p.config.into();
        check_heartbeat(&p.agent_id, &change)?;
        let agent = engine
            .agents
            .update(&p.agent_id, change, &snap, p.dry_run)
            .await?;
        if !p.dry_run {
            resync_heartbeats(engine).await;
        }
        Ok(AgentsUpdateResult {
            agent_id: p.agent_id,
            updated: !p.dry_run,
            dry_run: p.dry_run,
            agent: self.agent_record(&agent),
        })
    }

    async fn delete(
        &self,
        _ctx: &CallContext,
        p: AgentsDeleteParams,
    ) -> Result<AgentsDeleteResult, GatewayError> {
        self.engine().agents.delete(&p.agent_id).await?;
        self.engine().emit(
            "agent:hot_removed",
            serde_json::json!({"agentId": p.agent_id}),
        );
        Ok(AgentsDeleteResult {
            agent_id: p.agent_id,
            deleted: true,
        })
    }

    async fn suspend(
        &self,
        _ctx: &CallContext,
        p: AgentsSuspendParams,
    ) -> Result<AgentsSuspendResult, GatewayError> {
        let changed = self
            .engine()
            .agents
            .set_suspended(&p.agent_id, true)
            .await?;
        Ok(AgentsSuspendResult {
            agent_id: p.agent_id,
            suspended: true,
            changed,
        })
    }

    async fn resume(
        &self,
        _ctx: &CallContext,
        p: AgentsResumeParams,
    ) -> Result<AgentsResumeResult, GatewayError> {
        let changed = self
            .engine()
            .agents
            .set_suspended(&p.agent_id, false)
            .await?;
        Ok(AgentsResumeResult {
            agent_id: p.agent_id,
            resumed: true,
            changed,
        })
    }
}
