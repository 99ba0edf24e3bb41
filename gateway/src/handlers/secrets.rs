//! `secrets.*`: the encrypted secret store, by name. Values go in through `secrets.set` and
//! come out only through `secrets.get`; events carry names only.

use super::Rpc;
use crate::api::error::GatewayError;
use crate::api::generated::handlers::SecretsApi;
use crate::api::generated::types::{
    SecretsDeleteParams, SecretsDeleteResult, SecretsGetParams, SecretsGetResult,
    SecretsListParams, SecretsListResult, SecretsListResultSecretsItem, SecretsSetParams,
    SecretsSetResult,
};
use crate::api::CallContext;
use crate::config::REDACTED;

/// After a secret changed: providers are rebuilt (their keys resolved again) and the change
/// is announced.
pub(crate) async fn modified(rpc: &Rpc, ctx: &CallContext, name: &str, action: &str) {
    if let Err(e) = rpc.engine().providers.reload().await {
        tracing::warn!(error = %e, "providers not rebuilt after a secret changed");
    }
    announce(rpc, ctx, name, action);
}

/// `secret:modified` (name and action only, for admin subscribers) and a log line.
pub(crate) fn announce(rpc: &Rpc, ctx: &CallContext, name: &str, action: &str) {
    tracing::info!(secret = %crate::logging::escaped(name), action, client = %ctx.principal.client_id, "secret changed");
    rpc.engine().emit_operator(
        "secret:modified",
        serde_json::json!({"name": name, "action": action, "clientId": ctx.principal.client_id}),
    );
}

impl SecretsApi for Rpc {
    async fn list(
        &self,
        _ctx: &CallContext,
        _params: SecretsListParams,
    ) -> Result<SecretsListResult, GatewayError> {
        self.engine().secrets.cipher()?;
        let list = self.engine().secrets.list(false).await?;
        Ok(SecretsListResult {
            secrets: list
                .into_iter()
                .map(|m| SecretsListResultSecretsItem {
                    name: m.name,
                    provider: m.provider,
                    description: m.description,
                    expires_at: m.expires_at,
                    created_at: m.created_at.unwrap_or(0),
                    updated_at: m.updated_at.unwrap_or(0),
                })
                .collect(),
        })
    }

    async fn get(
        &self,
        ctx: &CallContext,
        params: SecretsGetParams,
    ) -> Result<SecretsGetResult, GatewayError> {
        let value = self.engine().secrets.get(&params.name).await?;
        tracing::info!(secret = %crate::logging::escaped(&params.name), client = %ctx.principal.client_id, found = value.is_some(), "secret read");
        self.engine().emit_operator(
            "secret:accessed",
            serde_json::json!({"name": params.name, "clientId": ctx.principal.client_id,
                               "exists": value.is_some()}),
        );
        Ok(SecretsGetResult {
            name: params.name,
            exists: value.is_some(),
            value,
        })
    }

    async fn set(
        &self,
        ctx: &CallContext,
        params: SecretsSetParams,
    ) -> Result<SecretsSetResult, GatewayError> {
        self.engine().secrets.cipher()?;
        if params.value == REDACTED {
            return Err(GatewayError::InvalidParams(format!(
                "'value' is the redacted placeholder {REDACTED}, not a secret"
            )));
        }
        let (created, _) = self
            .engine()
            .secrets
            .set(
                &params.name,
                &params.value,
                params.provider,
                params.description,
                params.expires_at,
            )
            .await?;
        modified(self, ctx, &params.name, "set").await;
        Ok(SecretsSetResult {
            name: params.name,
            created,
            restarting: false,
        })
    }

    async fn delete(
        &self,
        ctx: &CallContext,
        params: SecretsDeleteParams,
    ) -> Result<SecretsDeleteResult, GatewayError> {
        let deleted = self.engine().secrets.delete(&params.name).await?;
        if deleted {
            modified(self, ctx, &params.name, "delete").await;
        }
        Ok(SecretsDeleteResult {
            name: params.name,
            deleted,
            restarting: false,
        })
    }
}
