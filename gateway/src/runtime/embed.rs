//! Embeddings through the catalogue: which model a name resolves to, the provider call with
//! its timeout, and a usage row per call.

use std::time::Instant;

use tokio_util::sync::CancellationToken;

use crate::api::error::GatewayError;
use crate::api::generated::types::ModelsCapability;
use crate::providers::models::{self, ModelInfo};
use crate::providers::{Embeddings, ErrorKind, Usage};
use crate::runtime::engine::Engine;
use crate::store::usage::UsageRow;

/// Why an embedding could not be made.
#[derive(Debug)]
pub enum EmbedError {
    /// No model of the catalogue can embed.
    NoEmbeddingProvider,
    /// The name matches no embedding model.
    ModelNotFound,
    /// The provider failed (after its timeout).
    Failed(GatewayError),
}

impl Engine {
    /// Embeds `inputs` with the embedding model `name` names.
    pub async fn embed(
        &self,
        name: &str,
        inputs: &[String],
        cancel: &CancellationToken,
    ) -> Result<(ModelInfo, Embeddings), EmbedError> {
        let snap = self.providers.snapshot();
        let embedders: Vec<ModelInfo> = snap
            .models
            .iter()
            .filter(|m| m.can(ModelsCapability::Embeddings))
            .filter(|m| snap.providers.get(&m.provider).is_some_and(|p| p.enabled()))
            .cloned()
            .collect();
        if embedders.is_empty() {
            return Err(EmbedError::NoEmbeddingProvider);
        }
        let model = models::resolve(&embedders, name)
            .cloned()
            .ok_or(EmbedError::ModelNotFound)?;
        let entry = snap
            .providers
            .get(&model.provider)
            .cloned()
            .ok_or(EmbedError::ModelNotFound)?;
        let instance = entry
            .instance
            .clone()
            .map_err(|e| EmbedError::Failed(GatewayError::Unavailable(e)))?;
        if entry.kind == crate::providers::ProviderKind::Local {
            self.providers.ensure_local(entry.timeout()).await;
        }
        let started = Instant::now();
        let result = tokio::time::timeout(
            entry.timeout(),
            instance.embed(&model.model_id, inputs, cancel),
        )
        .await
        .unwrap_or_else(|_| {
            Err(crate::providers::ProviderError::new(
                ErrorKind::Timeout,
                "no answer in time",
            ))
        });
        let tokens = result.as_ref().map(|e| e.input_tokens).unwrap_or(0);
        let row = UsageRow {
            ts: crate::clock::now_ms(),
            agent_id: String::new(),
            session_key: None,
            provider: entry.id.clone(),
            model: model.id(),
            operation: "embed".to_owned(),
            input_tokens: tokens as i64,
            output_tokens: 0,
            cached_tokens: 0,
            cost_usd: model.cost(&Usage {
                input: tokens,
                ..Usage::default()
            }),
            latency_ms: started.elapsed().as_millis() as i64,
            ok: result.is_ok(),
            error_kind: result.as_ref().err().map(|e| e.kind.as_str().to_owned()),
            ..UsageRow::default()
        };
        if let Err(e) = self.store.usage_record(row.clone()) {
            tracing::error!(error = %e, "usage not recorded");
        }
        match result {
            Ok(e) => Ok((model, e)),
            Err(e) => Err(EmbedError::Failed(GatewayError::Unavailable(format!(
                "The embedding model {} failed ({}): {}",
                model.id(),
                e.kind.as_str(),
                e.message
            )))),
        }
    }
}
