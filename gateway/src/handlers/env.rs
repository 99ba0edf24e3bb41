//! `env.*`: secrets the daemon reads as environment variables, written to the secret store (or
//! the fallback env file) and listed by name, each method under its gateway-wide rate limit.

use super::Rpc;
use crate::api::error::GatewayError;
use crate::api::generated::handlers::EnvApi;
use crate::api::generated::types::{
    EnvListParams, EnvListResult, EnvListResultSecretsItem, EnvListResultSecretsItemSource,
    EnvSetParams, EnvSetResult, EnvSetResultStorage,
};
use crate::api::CallContext;
use crate::config::REDACTED;

/// `*` any run of characters, `?` one character; everything else literal (the `wildmatch`
/// crate).
fn glob_match(pattern: &str, name: &str) -> bool {
    wildmatch::WildMatch::new(pattern).matches(name)
}

impl EnvApi for Rpc {
    async fn set(
        &self,
        ctx: &CallContext,
        params: EnvSetParams,
    ) -> Result<EnvSetResult, GatewayError> {
        self.state.control.limits.env_set()?;
        if params.value == REDACTED {
            return Err(GatewayError::InvalidParams(format!(
                "'value' is the redacted placeholder {REDACTED}, not a secret"
            )));
        }
        let secrets = &self.engine().secrets;
        let (_, encrypted) = secrets
            .set(&params.key, &params.value, None, None, None)
            .await?;
        super::secrets::modified(self, ctx, &params.key, "set").await;
        Ok(EnvSetResult {
            set: true,
            key: params.key,
            storage: if encrypted {
                EnvSetResultStorage::Encrypted
            } else {
                EnvSetResultStorage::File
            },
            restarting: false,
        })
    }

    async fn list(
        &self,
        _ctx: &CallContext,
        params: EnvListParams,
    ) -> Result<EnvListResult, GatewayError> {
        self.state.control.limits.env_list()?;
        let all = self.engine().secrets.list(true).await?;
        let matching: Vec<_> = all
            .into_iter()
            .filter(|m| {
                params
                    .filter
                    .as_deref()
                    .is_none_or(|f| glob_match(f, &m.name))
            })
            .collect();
        let total = matching.len() as i64;
        let secrets: Vec<EnvListResultSecretsItem> = matching
            .into_iter()
            .take(params.limit as usize)
            .map(|m| EnvListResultSecretsItem {
                name: m.name,
                source: if m.encrypted {
                    EnvListResultSecretsItemSource::Secretstore
                } else {
                    EnvListResultSecretsItemSource::Envfile
                },
                provider: m.provider,
                description: m.description,
                created_at: m.created_at,
                updated_at: m.updated_at,
                expires_at: m.expires_at,
            })
            .collect();
        Ok(EnvListResult {
            truncated: total > secrets.len() as i64,
            total,
            secrets,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::glob_match;

    #[test]
    fn globs() {
        assert!(glob_match("OPENAI_*", "OPENAI_API_KEY"));
        assert!(glob_match("*KEY", "OPENAI_API_KEY"));
        assert!(glob_match("A?C", "ABC"));
        assert!(!glob_match("A?C", "ABBC"));
        assert!(glob_match("*", ""));
        assert!(!glob_match("OPENAI_*", "ANTHROPIC_API_KEY"));
        assert!(glob_match("*_*_*", "A_B_C"));
    }
}
