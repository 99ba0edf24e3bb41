//! `models.*`: the model catalogue, and a live check of a provider.

use std::time::Instant;

use tokio_util::sync::CancellationToken;

use super::Rpc;
use crate::api::error::GatewayError;
use crate::api::generated::handlers::ModelsApi;
use crate::api::generated::types::{
    ModelsCapability, ModelsListParams, ModelsListProvidersParams, ModelsListProvidersResult,
    ModelsListResult, ModelsTestParams, ModelsTestResult, ModelsTestResultErrorKind as Kind,
};
use crate::api::CallContext;
use crate::providers::retry::{chat_with_retry, RetryPolicy};
use crate::providers::{ChatMessage, ChatRequest, ErrorKind, ProviderError};
use crate::store::usage::UsageRow;

fn kind(e: &ProviderError) -> Kind {
    match e.kind {
        ErrorKind::Auth => Kind::Auth,
        ErrorKind::NotFound => Kind::NotFound,
        ErrorKind::RateLimited => Kind::RateLimited,
        ErrorKind::Timeout => Kind::Timeout,
        ErrorKind::Network => Kind::Network,
        ErrorKind::MissingKey => Kind::MissingKey,
        _ => Kind::ProviderError,
    }
}

impl ModelsApi for Rpc {
    async fn list(
        &self,
        _ctx: &CallContext,
        p: ModelsListParams,
    ) -> Result<ModelsListResult, GatewayError> {
        let providers = &self.engine().providers;
        let snap = providers.snapshot();
        let models: Vec<_> = snap
            .models
            .iter()
            .filter(|m| p.provider.as_deref().is_none_or(|id| m.provider == id))
            .map(|m| m.entry(providers.available(&snap, m)))
            .collect();
        Ok(ModelsListResult {
            total: models.len() as i64,
            models,
        })
    }

    async fn list_providers(
        &self,
        _ctx: &CallContext,
        _p: ModelsListProvidersParams,
    ) -> Result<ModelsListProvidersResult, GatewayError> {
        let snap = self.engine().providers.snapshot();
        let mut ids: Vec<String> = snap.models.iter().map(|m| m.provider.clone()).collect();
        ids.dedup();
        Ok(ModelsListProvidersResult {
            count: ids.len() as i64,
            providers: ids,
        })
    }

    async fn test(
        &self,
        _ctx: &CallContext,
        p: ModelsTestParams,
    ) -> Result<ModelsTestResult, GatewayError> {
        let engine = self.engine();
        let snap = engine.providers.snapshot();
        let entry = snap
            .providers
            .get(&p.provider)
            .cloned()
            .ok_or_else(|| GatewayError::not_found("Provider", &p.provider))?;
        let model_id = match &p.model {
            Some(m) => m.clone(),
            None => entry
                .config
                .models
                .as_ref()
                .and_then(|m| m.first().cloned())
                .unwrap_or_default(),
        };
        let full = format!("{}/{model_id}", p.provider);
        let info = snap.model(&full).cloned();
        let started = Instant::now();
        let outcome: Result<(), ProviderError> = async {
            if !entry.key_configured {
                return Err(ProviderError::new(
                    ErrorKind::MissingKey,
                    format!(
                        "the variable {} is not set",
                        entry.config.api_key_env.as_deref().unwrap_or("?")
                    ),
                ));
            }
            let instance = entry
                .instance
                .clone()
                .map_err(|e| ProviderError::new(ErrorKind::ProviderError, e))?;
            let cancel = CancellationToken::new();
            let embed_only = info.as_ref().is_some_and(|m| {
                m.can(ModelsCapability::Embeddings) && !m.can(ModelsCapability::Chat)
            });
            if embed_only {
                let input = vec!["ping".to_owned()];
                tokio::time::timeout(entry.timeout(), instance.embed(&model_id, &input, &cancel))
                    .await
                    .map_err(|_| ProviderError::new(ErrorKind::Timeout, "no answer in time"))?
                    .map(|_| ())
            } else {
                let req = ChatRequest {
                    model: model_id.clone(),
                    system: None,
                    messages: vec![ChatMessage::user("Reply with the word pong.")],
                    tools: Vec::new(),
                    max_tokens: Some(8),
                    temperature: None,
                };
                let policy = RetryPolicy::new(0, entry.timeout());
                let (r, _) = chat_with_retry(instance.as_ref(), &req, None, policy, &cancel).await;
                if let (Ok(resp), Some(m)) = (&r, &info) {
                    let row = UsageRow {
                        ts: crate::clock::now_ms(),
                        agent_id: String::new(),
                        session_key: None,
                        provider: p.provider.clone(),
                        model: full.clone(),
                        operation: "test".to_owned(),
                        input_tokens: resp.usage.input as i64,
                        output_tokens: resp.usage.output as i64,
                        cached_tokens: resp.usage.cached_input as i64,
                        cache_write_tokens: resp.usage.cache_write as i64,
                        cost_usd: m.cost(&resp.usage),
                        cache_saved_usd: m.cache_saving(&resp.usage),
                        latency_ms: started.elapsed().as_millis() as i64,
                        ok: true,
                        error_kind: None,
                    };
                    if let Err(e) = engine.store.usage_record(row.clone()) {
                        tracing::error!(error = %e, "usage not recorded");
                    }
                }
                r.map(|_| ())
            }
        }
        .await;
        let latency_ms = started.elapsed().as_millis() as i64;
        Ok(match outcome {
            Ok(()) => ModelsTestResult {
                provider: p.provider,
                model: full,
                ok: true,
                latency_ms,
                error_kind: None,
                error: None,
            },
            Err(e) => ModelsTestResult {
                provider: p.provider,
                model: full,
                ok: false,
                latency_ms,
                error_kind: Some(kind(&e)),
                error: Some(e.message.chars().take(1000).collect()),
            },
        })
    }
}
