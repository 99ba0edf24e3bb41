//! `auth.*`: stored OAuth credentials of provider profiles, encrypted like secrets (the
//! profile id as associated data); listed by metadata only.

use super::Rpc;
use crate::api::error::GatewayError;
use crate::api::generated::handlers::AuthApi;
use crate::api::generated::types::{
    AuthListParams, AuthListResult, AuthListResultProfilesItem, AuthLogoutParams, AuthLogoutResult,
    AuthSetParams, AuthSetResult,
};
use crate::api::CallContext;
use crate::clock::now_ms;
use crate::store::control_plane::AuthRow;

/// What the associated data of a profile's ciphertext is (never equal to a secret's name,
/// which has no colon).
fn aad(profile_id: &str) -> String {
    format!("auth:{profile_id}")
}

impl AuthApi for Rpc {
    async fn list(
        &self,
        _ctx: &CallContext,
        params: AuthListParams,
    ) -> Result<AuthListResult, GatewayError> {
        let rows = self
            .engine()
            .store
            .auth_list(params.provider.as_deref())
            .await?;
        Ok(AuthListResult {
            profiles: rows
                .into_iter()
                .map(|r| AuthListResultProfilesItem {
                    provider: r.provider,
                    profile_id: r.profile_id,
                    expires: r.expires,
                    account_id: r.account_id,
                    email: r.email,
                    display_name: r.display_name,
                })
                .collect(),
        })
    }

    async fn set(
        &self,
        ctx: &CallContext,
        params: AuthSetParams,
    ) -> Result<AuthSetResult, GatewayError> {
        let cipher = self.engine().secrets.cipher()?;
        if !self
            .engine()
            .providers
            .snapshot()
            .providers
            .contains_key(&params.provider)
        {
            return Err(GatewayError::not_found("Provider", &params.provider));
        }
        let plain = serde_json::json!({"access": params.access, "refresh": params.refresh});
        let (nonce, ciphertext) =
            cipher.seal(&aad(&params.profile_id), plain.to_string().as_bytes())?;
        let now = now_ms();
        self.engine()
            .store
            .auth_put(&AuthRow {
                profile_id: params.profile_id.clone(),
                provider: params.provider.clone(),
                nonce,
                ciphertext,
                expires: params.expires,
                account_id: params.account_id,
                email: params.email,
                display_name: params.display_name,
                created_at: now,
                updated_at: now,
            })
            .await?;
        tracing::info!(profile = %crate::logging::escaped(&params.profile_id), provider = %crate::logging::escaped(&params.provider), client = %ctx.principal.client_id, "auth profile stored");
        // No provider reads auth profiles yet: nothing to rebuild, only the announcement.
        super::secrets::announce(self, ctx, &aad(&params.profile_id), "set");
        Ok(AuthSetResult {
            profile_id: params.profile_id,
            stored: true,
        })
    }

    async fn logout(
        &self,
        ctx: &CallContext,
        params: AuthLogoutParams,
    ) -> Result<AuthLogoutResult, GatewayError> {
        let deleted = self.engine().store.auth_delete(&params.profile_id).await?;
        if deleted {
            super::secrets::announce(self, ctx, &aad(&params.profile_id), "delete");
        }
        Ok(AuthLogoutResult {
            profile_id: params.profile_id,
            deleted,
        })
    }
}
