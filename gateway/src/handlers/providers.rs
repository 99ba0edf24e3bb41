//! `providers.*`: the model providers, persisted and applied without a restart.

use super::Rpc;
use crate::api::error::GatewayError;
use crate::api::generated::handlers::ProvidersApi;
use crate::api::generated::types::{
    ProvidersCreateParams, ProvidersCreateResult, ProvidersDeleteParams, ProvidersDeleteResult,
    ProvidersDisableParams, ProvidersDisableResult, ProvidersEnableParams, ProvidersEnableResult,
    ProvidersGetParams, ProvidersListParams, ProvidersListResult, ProvidersRecord,
    ProvidersUpdateParams, ProvidersUpdateResult,
};
use crate::api::CallContext;
use crate::config::agents::ProviderType;
use crate::providers::registry::{ProviderEntry, DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT_MS};

impl Rpc {
    /// Agents whose primary, fallback or per-operation model is served by `provider`.
    fn agents_using(&self, provider: &str) -> Vec<String> {
        let prefix = format!("{provider}/");
        self.engine()
            .agents
            .all()
            .into_iter()
            .filter(|a| {
                let c = &a.config;
                a.model().starts_with(&prefix)
                    || c.fallback_models
                        .iter()
                        .flatten()
                        .any(|m| m.starts_with(&prefix))
                    || c.operation_models
                        .iter()
                        .flat_map(|m| m.values())
                        .any(|m| m.starts_with(&prefix))
            })
            .map(|a| a.id.clone())
            .collect()
    }

    fn provider_record(&self, id: &str) -> Result<ProvidersRecord, GatewayError> {
        let snap = self.engine().providers.snapshot();
        let entry = snap
            .providers
            .get(id)
            .ok_or_else(|| GatewayError::not_found("Provider", id))?;
        Ok(provider_record(entry, self.agents_using(id)))
    }
}

/// The wire record of a provider, built from its (completed) domain settings.
fn provider_record(entry: &ProviderEntry, agents_using: Vec<String>) -> ProvidersRecord {
    let c = &entry.config;
    ProvidersRecord {
        provider_id: entry.id.clone(),
        type_: c.type_.unwrap_or(ProviderType::Openai).into(),
        name: c.name.clone().unwrap_or_else(|| entry.id.clone()),
        base_url: c.base_url.clone(),
        api_key_env: c.api_key_env.clone(),
        api_key_configured: entry.key_configured,
        timeout_ms: c.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS),
        max_retries: c.max_retries.unwrap_or(DEFAULT_MAX_RETRIES),
        enabled: entry.enabled(),
        models: c.models.clone().unwrap_or_default(),
        agents_using,
        script: c
            .script
            .clone()
            .map(|s| s.into_iter().map(Into::into).collect()),
    }
}

impl ProvidersApi for Rpc {
    async fn list(
        &self,
        _ctx: &CallContext,
        _p: ProvidersListParams,
    ) -> Result<ProvidersListResult, GatewayError> {
        let snap = self.engine().providers.snapshot();
        Ok(ProvidersListResult {
            providers: snap
                .providers
                .values()
                .map(|e| provider_record(e, self.agents_using(&e.id)))
                .collect(),
        })
    }

    async fn get(
        &self,
        _ctx: &CallContext,
        p: ProvidersGetParams,
    ) -> Result<ProvidersRecord, GatewayError> {
        self.provider_record(&p.provider_id)
    }

    async fn create(
        &self,
        _ctx: &CallContext,
        p: ProvidersCreateParams,
    ) -> Result<ProvidersCreateResult, GatewayError> {
        self.engine()
            .providers
            .create(&p.provider_id, p.config.into())
            .await?;
        Ok(ProvidersCreateResult {
            provider: self.provider_record(&p.provider_id)?,
            provider_id: p.provider_id,
            created: true,
        })
    }

    async fn update(
        &self,
        _ctx: &CallContext,
        p: ProvidersUpdateParams,
    ) -> Result<ProvidersUpdateResult, GatewayError> {
        self.engine()
            .providers
            .update(&p.provider_id, p.config.into())
            .await?;
        Ok(ProvidersUpdateResult {
            provider: self.provider_record(&p.provider_id)?,
            provider_id: p.provider_id,
            updated: true,
        })
    }

    async fn delete(
        &self,
        _ctx: &CallContext,
        p: ProvidersDeleteParams,
    ) -> Result<ProvidersDeleteResult, GatewayError> {
        self.provider_record(&p.provider_id)?;
        let using = self.agents_using(&p.provider_id);
        if !using.is_empty() {
            return Err(GatewayError::Conflict(format!(
                "Provider {} is used by agents: {}",
                p.provider_id,
                using.join(", ")
            )));
        }
        self.engine().providers.delete(&p.provider_id).await?;
        Ok(ProvidersDeleteResult {
            provider_id: p.provider_id,
            deleted: true,
        })
    }

    async fn enable(
        &self,
        _ctx: &CallContext,
        p: ProvidersEnableParams,
    ) -> Result<ProvidersEnableResult, GatewayError> {
        let changed = self
            .engine()
            .providers
            .set_enabled(&p.provider_id, true)
            .await?;
        Ok(ProvidersEnableResult {
            provider_id: p.provider_id,
            enabled: true,
            changed,
        })
    }

    async fn disable(
        &self,
        _ctx: &CallContext,
        p: ProvidersDisableParams,
    ) -> Result<ProvidersDisableResult, GatewayError> {
        let changed = self
            .engine()
            .providers
            .set_enabled(&p.provider_id, false)
            .await?;
        let agents_using = self.agents_using(&p.provider_id);
        let warning = (!agents_using.is_empty()).then(|| {
            format!(
                "These agents cannot use this provider until it is enabled again: {}",
                agents_using.join(", ")
            )
        });
        Ok(ProvidersDisableResult {
            provider_id: p.provider_id,
            enabled: false,
            changed,
            agents_using,
            warning,
        })
    }
}
