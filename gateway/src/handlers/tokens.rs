//! `tokens.*`: API tokens in the store, beside the configuration's. A secret is shown once;
//! only its SHA-256 digest is stored; changes take effect at once on every node.

use super::Rpc;
use crate::api::error::GatewayError;
use crate::api::generated::handlers::TokensApi;
use crate::api::generated::methods::Scope;
use crate::api::generated::types::{
    TokensCreateParams, TokensCreateResult, TokensListParams, TokensListResult,
    TokensListResultTokensItem, TokensListResultTokensItemOrigin, TokensRevokeParams,
    TokensRevokeResult, TokensRotateParams, TokensRotateResult, TokensScope,
};
use crate::api::CallContext;
use crate::auth::{digest, new_secret};
use crate::clock::now_ms;
use crate::store::control_plane::TokenRow;

const SHOWN_ONCE: &str = "Store this secret now: it is not shown again.";

fn scope_of(s: TokensScope) -> Scope {
    match s {
        TokensScope::Rpc => Scope::Rpc,
        TokensScope::Admin => Scope::Admin,
        TokensScope::All => Scope::All,
        TokensScope::Api => Scope::Api,
        TokensScope::McpClient => Scope::McpClient,
        TokensScope::Metrics => Scope::Metrics,
    }
}

fn tokens_scope(s: Scope) -> TokensScope {
    match s {
        Scope::Rpc => TokensScope::Rpc,
        Scope::Admin => TokensScope::Admin,
        Scope::All => TokensScope::All,
        Scope::Api => TokensScope::Api,
        Scope::McpClient => TokensScope::McpClient,
        Scope::Metrics => TokensScope::Metrics,
    }
}

/// The scopes a token lists (a configuration token with none holds every scope: "*").
fn scopes_named(names: &[String]) -> Vec<TokensScope> {
    let v: Vec<TokensScope> = names
        .iter()
        .filter_map(|n| Scope::from_name(n))
        .map(tokens_scope)
        .collect();
    if v.is_empty() {
        vec![TokensScope::All]
    } else {
        v
    }
}

impl Rpc {
    fn config_token_refused(&self, id: &str) -> Result<(), GatewayError> {
        if self.state.tokens.is_config_id(id) {
            return Err(GatewayError::Conflict(format!(
                "Token '{id}' comes from gateway.tokens[] in the configuration: change it there \
                 (config.patch), not through tokens.*"
            )));
        }
        Ok(())
    }

    fn token_event(&self, ctx: &CallContext, action: &str, id: &str) {
        self.engine().emit_operator(
            "audit:event",
            serde_json::json!({"kind": "token", "action": action, "tokenId": id,
                               "clientId": ctx.principal.client_id}),
        );
    }
}

impl TokensApi for Rpc {
    async fn create(
        &self,
        ctx: &CallContext,
        params: TokensCreateParams,
    ) -> Result<TokensCreateResult, GatewayError> {
        let mut scopes = params.scopes.clone();
        scopes.sort();
        if scopes.windows(2).any(|w| w[0] == w[1]) {
            return Err(GatewayError::InvalidParams(
                "'scopes' repeats a scope".into(),
            ));
        }
        // Never more than the caller holds: "*" needs "*", each other scope itself (admin
        // also grants rpc).
        for s in &params.scopes {
            let needed = scope_of(*s);
            let held = match needed {
                Scope::All => ctx.principal.scopes.contains(Scope::All),
                other => ctx.principal.allows(other),
            };
            if !held {
                return Err(GatewayError::InvalidParams(format!(
                    "scope '{}' cannot be granted: the calling token does not hold it",
                    s.as_str()
                )));
            }
        }
        let now = now_ms();
        if params.expires_at.is_some_and(|at| at <= now) {
            return Err(GatewayError::InvalidParams(
                "'expiresAt' must be in the future".into(),
            ));
        }
        let id = params
            .id
            .clone()
            .unwrap_or_else(|| format!("tok-{}", &uuid::Uuid::new_v4().simple().to_string()[..16]));
        if self.state.tokens.is_config_id(&id) {
            return Err(GatewayError::Conflict(format!(
                "Token id '{id}' is in use by gateway.tokens[] in the configuration"
            )));
        }
        let secret = new_secret()?;
        let names: Vec<&str> = params.scopes.iter().map(|s| s.as_str()).collect();
        let row = TokenRow {
            id: id.clone(),
            digest: Some(hex::encode(digest(&secret))),
            scopes: serde_json::to_string(&names).unwrap_or_else(|_| "[]".into()),
            created_at: now,
            expires_at: params.expires_at,
            last_used_at: None,
            revoked_at: None,
        };
        if !self.engine().store.token_insert(&row).await? {
            return Err(GatewayError::Conflict(format!(
                "Token id '{id}' is in use (ids of revoked tokens stay reserved: they own their records)"
            )));
        }
        self.engine().api_tokens.reload().await?;
        tracing::info!(token = %crate::logging::escaped(&id), client = %ctx.principal.client_id, scopes = ?names, "token created");
        self.token_event(ctx, "created", &id);
        Ok(TokensCreateResult {
            id,
            secret,
            scopes: params.scopes,
            created_at: now,
            expires_at: params.expires_at,
            message: SHOWN_ONCE.into(),
        })
    }

    async fn list(
        &self,
        _ctx: &CallContext,
        _params: TokensListParams,
    ) -> Result<TokensListResult, GatewayError> {
        let item = |e: &crate::auth::Entry, origin| TokensListResultTokensItem {
            id: e.principal.client_id.clone(),
            scopes: scopes_named(&e.scopes),
            origin,
            created_at: e.created_at,
            last_used_at: e.last_used_at(),
            expires_at: e.expires_at,
        };
        let mut tokens: Vec<TokensListResultTokensItem> = self
            .state
            .tokens
            .config_tokens()
            .iter()
            .map(|e| item(e, TokensListResultTokensItemOrigin::Config))
            .chain(
                self.engine()
                    .api_tokens
                    .list()
                    .iter()
                    .map(|e| item(e, TokensListResultTokensItemOrigin::Store)),
            )
            .collect();
        tokens.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(TokensListResult { tokens })
    }

    async fn revoke(
        &self,
        ctx: &CallContext,
        params: TokensRevokeParams,
    ) -> Result<TokensRevokeResult, GatewayError> {
        self.config_token_refused(&params.id)?;
        if !self
            .engine()
            .store
            .token_revoke(&params.id, now_ms())
            .await?
        {
            return Err(GatewayError::not_found("Token", &params.id));
        }
        // Closes the token's WebSockets here (other nodes on the announcement).
        self.engine().api_tokens.reload().await?;
        tracing::info!(token = %crate::logging::escaped(&params.id), client = %ctx.principal.client_id, "token revoked");
        self.token_event(ctx, "revoked", &params.id);
        Ok(TokensRevokeResult {
            message: format!("Token {} revoked; its connections were closed.", params.id),
            id: params.id,
            revoked: true,
        })
    }

    async fn rotate(
        &self,
        ctx: &CallContext,
        params: TokensRotateParams,
    ) -> Result<TokensRotateResult, GatewayError> {
        self.config_token_refused(&params.id)?;
        let secret = new_secret()?;
        let now = now_ms();
        let Some(row) = self
            .engine()
            .store
            .token_rotate(&params.id, &hex::encode(digest(&secret)), now)
            .await?
        else {
            return Err(GatewayError::not_found("Token", &params.id));
        };
        self.engine().api_tokens.reload().await?;
        tracing::info!(token = %crate::logging::escaped(&params.id), client = %ctx.principal.client_id, "token rotated");
        self.token_event(ctx, "rotated", &params.id);
        let names: Vec<String> = serde_json::from_str(&row.scopes).unwrap_or_default();
        Ok(TokensRotateResult {
            old_id: params.id.clone(),
            new_id: params.id,
            new_secret: secret,
            scopes: scopes_named(&names),
            created_at: now,
            expires_at: row.expires_at,
            message: SHOWN_ONCE.into(),
        })
    }
}
