//! `agent.*`: running a turn, and reading per-agent routing and prompt-cache figures.

use std::sync::Arc;

use super::Rpc;
use crate::api::error::GatewayError;
use crate::api::generated::handlers::AgentApi;
use crate::api::generated::methods::Scope;
use crate::api::generated::types::{
    AgentCacheStatsParams, AgentCacheStatsResult, AgentCacheStatsResultProvidersItem,
    AgentExecuteParams, AgentGetOperationModelsParams, AgentGetOperationModelsResult,
    AgentGetOperationModelsResultOperationsItem as Operation,
    AgentGetOperationModelsResultOperationsItemSource as Source, AgentStreamParams,
    AgentTurnResult, ModelsCapability, SessionKeyParts,
};
use crate::api::scopes::Scopes;
use crate::api::CallContext;
use crate::runtime::agents::Agent;
use crate::runtime::sessions::{CallerKey, KeyPart, SessionIdent};
use crate::runtime::turn::TurnRequest;

impl Rpc {
    /// The named agent, or the default agent.
    pub(crate) fn agent_or_default(&self, id: Option<&str>) -> Result<Arc<Agent>, GatewayError> {
        self.engine().agents.require_or_default(id)
    }

    /// The session a key object names, owned by the caller or the tenant it names (the
    /// catalogue's `tenant` rule on `sessionKey.tenantId` lets only admin tokens name another,
    /// and [`SessionIdent::for_caller`] never yields another owner: the rule checks the very
    /// owner the turn uses). A channel of the gateway's own sessions is -32602.
    pub(super) fn session_ident(
        &self,
        ctx: &CallContext,
        agent: &Agent,
        parts: &SessionKeyParts,
    ) -> Result<SessionIdent, GatewayError> {
        let key = CallerKey {
            channel: parts.channel_id.as_deref(),
            tenant: parts.tenant_id.as_deref(),
            user: parts.user_id.as_deref(),
        };
        SessionIdent::for_caller(ctx, &agent.id, key).map_err(|r| {
            r.named(|part| match part {
                KeyPart::Agent => "agentId",
                KeyPart::Channel => "sessionKey.channelId",
                KeyPart::Tenant => "sessionKey.tenantId",
                KeyPart::User => "sessionKey.userId",
            })
        })
    }

    /// The caller's scopes, narrowed to `requested` when given (never widened).
    pub(super) fn turn_scopes(
        ctx: &CallContext,
        requested: Option<&[String]>,
    ) -> Result<Scopes, GatewayError> {
        let Some(requested) = requested else {
            return Ok(ctx.scopes);
        };
        let mut out = Scopes::EMPTY;
        for name in requested {
            let scope = Scope::from_name(name).ok_or_else(|| {
                GatewayError::InvalidParams(format!("'scopes': unknown scope '{name}'"))
            })?;
            if ctx.allows(scope) {
                out.insert(scope);
            }
        }
        Ok(out)
    }

    async fn turn(
        &self,
        ctx: &CallContext,
        message: String,
        agent_id: Option<String>,
        session_key: Option<SessionKeyParts>,
        scopes: Option<Vec<String>>,
    ) -> Result<AgentTurnResult, GatewayError> {
        let agent = self.agent_or_default(agent_id.as_deref())?;
        let session = session_key
            .map(|p| self.session_ident(ctx, &agent, &p))
            .transpose()?;
        let scopes = Self::turn_scopes(ctx, scopes.as_deref())?;
        let outcome = self
            .engine()
            .turns
            .run_turn(TurnRequest {
                session,
                scopes,
                ..TurnRequest::new(agent, message, ctx)
            })
            .await?;
        Ok(outcome.result())
    }
}

impl AgentApi for Rpc {
    async fn execute(
        &self,
        ctx: &CallContext,
        p: AgentExecuteParams,
    ) -> Result<AgentTurnResult, GatewayError> {
        self.turn(ctx, p.message, p.agent_id, p.session_key, p.scopes)
            .await
    }

    async fn stream(
        &self,
        ctx: &CallContext,
        p: AgentStreamParams,
    ) -> Result<AgentTurnResult, GatewayError> {
        tracing::warn!(
            client = %ctx.client_id,
            "agent.stream cannot stream over JSON-RPC; answering once (use /api/chat/stream for tokens)"
        );
        self.turn(ctx, p.message, p.agent_id, p.session_key, p.scopes)
            .await
    }

    async fn cache_stats(
        &self,
        _ctx: &CallContext,
        p: AgentCacheStatsParams,
    ) -> Result<AgentCacheStatsResult, GatewayError> {
        let engine = self.engine();
        if let Some(id) = &p.agent_id {
            engine.agents.require(id)?;
        }
        let by_provider = engine
            .store
            .usage_sums(crate::store::obs::UsageWindow {
                since: p.since_ms,
                agent: p.agent_id.as_deref(),
                ..Default::default()
            })
            .await?;
        let all = crate::store::obs::Sums::total(by_provider.values());
        Ok(AgentCacheStatsResult {
            hits: all.cache_hits,
            misses: all.misses(),
            hit_rate: all.hit_rate(),
            cached_tokens: all.cached_tokens,
            // Priced when each call was made (the same figure as obs.getCacheStats).
            total_cache_saved: all.cache_saved_usd,
            providers: by_provider
                .into_iter()
                .filter(|(_, f)| f.calls > 0)
                .map(|(provider, f)| AgentCacheStatsResultProvidersItem {
                    provider,
                    hits: f.cache_hits,
                    misses: f.misses(),
                    cached_tokens: f.cached_tokens,
                })
                .collect(),
        })
    }

    async fn get_operation_models(
        &self,
        _ctx: &CallContext,
        p: AgentGetOperationModelsParams,
    ) -> Result<AgentGetOperationModelsResult, GatewayError> {
        let engine = self.engine();
        let agent = engine.agents.require(&p.agent_id)?;
        let snap = engine.providers.snapshot();
        let primary = agent.model().to_owned();
        let (primary_provider, _) = primary.split_once('/').unwrap_or((primary.as_str(), ""));
        let family = |provider: &str| {
            snap.providers
                .get(provider)
                .map_or("unknown", |p| p.kind.as_str())
                .to_owned()
        };
        let default_embed = snap
            .models
            .iter()
            .find(|m| m.can(ModelsCapability::Embeddings))
            .map(|m| m.id());
        let mut ops = vec![("chat", Some(primary.clone()), false)];
        for op in crate::runtime::agents::OPERATIONS {
            match agent.operation_model(op) {
                Some(m) => ops.push((op, Some(m.to_owned()), true)),
                None if *op == "embed" => ops.push((op, default_embed.clone(), false)),
                None => ops.push((op, Some(primary.clone()), false)),
            }
        }
        let operations: Vec<Operation> = ops
            .into_iter()
            .filter_map(|(op, model, configured)| {
                let model = model?;
                let (provider, model_id) = model.split_once('/')?;
                let entry = snap.providers.get(provider);
                Some(Operation {
                    operation_type: op.to_owned(),
                    model: model.clone(),
                    provider: provider.to_owned(),
                    model_id: model_id.to_owned(),
                    source: if configured {
                        Source::Config
                    } else {
                        Source::Default
                    },
                    timeout_ms: entry.map_or(0, |e| e.timeout().as_millis() as i64),
                    tiering_active: model != primary,
                    cross_provider: provider != primary_provider,
                    api_key_configured: entry.is_some_and(|e| e.key_configured),
                })
            })
            .collect();
        Ok(AgentGetOperationModelsResult {
            agent_id: agent.id.clone(),
            primary_model: primary.clone(),
            primary_provider: primary_provider.to_owned(),
            provider_family: family(primary_provider),
            tiering_active: operations.iter().any(|o| o.tiering_active),
            operations,
        })
    }
}
