//! The one way the engine calls a model: a chat step over a model chain (each model with its
//! provider's retries, fallbacks announced) and embeddings through the catalogue (which model
//! a name resolves to, the call with its provider's timeout). Every call leaves a usage row,
//! its metrics and its `observability:token_usage` event. Turns, the summary tree and memory
//! consolidation share it.

use std::sync::Arc;
use std::time::Instant;

use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::api::error::GatewayError;
use crate::api::generated::types::ModelsCapability;
use crate::providers::models::{self, ModelInfo};
use crate::providers::registry::Providers;
use crate::providers::retry::{chat_with_retry, RetryPolicy};
use crate::providers::{
    ChatRequest, ChatResponse, DeltaSink, Embeddings, ErrorKind, ProviderError, ProviderKind, Usage,
};
use crate::runtime::control::Control;
use crate::store::usage::UsageRow;
use crate::store::Store;

/// Calls models: the store for usage rows, the providers' catalogue, the event bus.
#[derive(Clone)]
pub struct ModelCalls {
    store: Store,
    providers: Arc<Providers>,
    control: Arc<Control>,
}

/// Whom a model call's usage is recorded for.
pub(crate) struct CallFor<'a> {
    pub agent_id: &'a str,
    pub session_key: Option<&'a str>,
    /// The tenant whose session the call serves (its events are that tenant's); None for a
    /// call that serves no tenant's session.
    pub owner: Option<&'a Arc<str>>,
    /// chat, summarize, ...
    pub operation: &'a str,
}

pub(crate) struct Called {
    pub response: ChatResponse,
    pub model: ModelInfo,
}

/// A model step that failed.
pub(crate) struct StepFailed {
    pub error: ProviderError,
    /// Text of this step had reached the caller.
    pub after_output: bool,
}

#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct TokenUsage {
    agent_id: String,
    provider: String,
    model: String,
    operation: String,
    input_tokens: i64,
    output_tokens: i64,
    cached_tokens: i64,
    cost_usd: f64,
    latency_ms: i64,
    ok: bool,
}

impl TokenUsage {
    fn of(row: &UsageRow) -> Self {
        Self {
            agent_id: row.agent_id.clone(),
            provider: row.provider.clone(),
            model: row.model.clone(),
            operation: row.operation.clone(),
            input_tokens: row.input_tokens,
            output_tokens: row.output_tokens,
            cached_tokens: row.cached_tokens,
            cost_usd: row.cost_usd,
            latency_ms: row.latency_ms,
            ok: row.ok,
        }
    }
}

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

impl ModelCalls {
    pub fn new(store: Store, providers: Arc<Providers>, control: Arc<Control>) -> Self {
        Self {
            store,
            providers,
            control,
        }
    }

    /// The catalogue the calls resolve models in.
    pub fn providers(&self) -> &Providers {
        &self.providers
    }

    /// Publishes an event of `owner` (None: system-wide).
    fn emit_for<T: serde::Serialize + Send + Sync + 'static>(
        &self,
        owner: Option<&Arc<str>>,
        name: &'static str,
        data: T,
    ) {
        self.control
            .events
            .publish_owned(owner.cloned(), name, data);
    }

    /// One model step: the models of the chain in order, each with its provider's retries;
    /// every call's usage is recorded.
    pub(crate) async fn call_chain(
        &self,
        chain: &[String],
        request: ChatRequest,
        sink: Option<&DeltaSink>,
        cancel: &CancellationToken,
        who: CallFor<'_>,
    ) -> Result<Called, ProviderError> {
        self.call_step(chain, request, sink, cancel, who)
            .await
            .map_err(|f| f.error)
    }

    /// [`Self::call_chain`], saying whether the step had streamed text before it failed: then
    /// no fallback model runs (the caller has seen the first model's words; a second model's
    /// would be mixed into the same answer).
    pub(crate) async fn call_step(
        &self,
        chain: &[String],
        mut request: ChatRequest,
        sink: Option<&DeltaSink>,
        cancel: &CancellationToken,
        who: CallFor<'_>,
    ) -> Result<Called, StepFailed> {
        // Backpressure: while the record writer is far behind, calls wait to start (their
        // usage rows are never dropped); at once otherwise.
        self.store.usage_room().await;
        // One sink for the step: it knows whether any attempt of any model streamed text.
        let step_sink = sink.map(DeltaSink::attempt);
        let sink = step_sink.as_ref();
        let streamed = || step_sink.as_ref().is_some_and(DeltaSink::sent_any);
        let snap = self.providers.snapshot();
        let mut last = ProviderError::new(ErrorKind::Unavailable, "no model configured");
        for (index, name) in chain.iter().enumerate() {
            let Some(model) = snap.model(name).cloned() else {
                last = ProviderError::new(ErrorKind::NotFound, format!("Model not found: {name}"));
                continue;
            };
            let Some(entry) = snap.providers.get(&model.provider).cloned() else {
                continue;
            };
            if !entry.enabled() {
                last = ProviderError::new(
                    ErrorKind::Unavailable,
                    format!(
                        "Provider {} is disabled (providers.enable turns it back on)",
                        entry.id
                    ),
                );
                continue;
            }
            if !entry.key_configured {
                last = ProviderError::new(
                    ErrorKind::MissingKey,
                    format!(
                        "Provider {} has no API key: store it with env.set or secrets.set, or set the environment variable, {}",
                        entry.id,
                        entry
                            .config
                            .api_key_env
                            .as_deref()
                            .unwrap_or("named by apiKeyEnv")
                    ),
                );
                continue;
            }
            let instance = match &entry.instance {
                Ok(i) => i.clone(),
                Err(e) => {
                    last = ProviderError::new(ErrorKind::Unavailable, e.clone());
                    continue;
                }
            };
            if entry.kind == ProviderKind::Local {
                self.providers.ensure_local(entry.timeout()).await;
            }
            request.model = model.model_id.clone();
            let started = Instant::now();
            let policy = RetryPolicy::new(entry.max_retries(), entry.timeout());
            let (result, _attempts) =
                chat_with_retry(instance.as_ref(), &request, sink, policy, cancel).await;
            let usage = result.as_ref().map(|r| r.usage).unwrap_or(Usage::default());
            let latency = started.elapsed();
            let row = UsageRow {
                ts: crate::clock::now_ms(),
                agent_id: who.agent_id.to_owned(),
                session_key: who.session_key.map(str::to_owned),
                provider: entry.id.clone(),
                model: model.id(),
                operation: who.operation.to_owned(),
                input_tokens: usage.input as i64,
                output_tokens: usage.output as i64,
                cached_tokens: usage.cached_input as i64,
                cache_write_tokens: usage.cache_write as i64,
                cost_usd: model.cost(&usage),
                cache_saved_usd: model.cache_saving(&usage),
                latency_ms: latency.as_millis() as i64,
                ok: result.is_ok(),
                error_kind: result.as_ref().err().map(|e| e.kind.as_str().to_owned()),
            };
            crate::metrics::model_call(
                &row.provider,
                &row.model,
                row.ok,
                usage.input,
                usage.output,
                usage.cached_input,
                row.cost_usd,
                latency,
            );
            if let Some(kind) = &row.error_kind {
                crate::obs::recorder::model_call_failed(
                    &self.store,
                    who.owner,
                    who.agent_id,
                    &row.provider,
                    &row.model,
                    kind,
                    row.latency_ms,
                );
            }
            self.emit_for(who.owner, "observability:token_usage", TokenUsage::of(&row));
            if let Err(e) = self.store.usage_record(row) {
                tracing::error!(error = %e, "usage not recorded");
            }
            match result {
                Ok(response) => return Ok(Called { response, model }),
                Err(e) if e.kind == ErrorKind::Cancelled || streamed() => {
                    if e.kind != ErrorKind::Cancelled && index + 1 < chain.len() {
                        tracing::warn!(model = %model.id(), kind = e.kind.as_str(), "model failed after streaming text; no fallback model runs");
                    }
                    return Err(StepFailed {
                        error: e,
                        after_output: streamed(),
                    });
                }
                Err(e) => {
                    tracing::warn!(model = %model.id(), kind = e.kind.as_str(), "model failed; trying the next fallback if any");
                    if index + 1 < chain.len() {
                        self.emit_for(
                            who.owner,
                            "model:fallback_attempt",
                            json!({"agentId": who.agent_id, "failed": model.id(),
                                   "next": chain[index + 1], "reason": e.kind.as_str()}),
                        );
                    }
                    last = e;
                }
            }
        }
        if chain.len() > 1 {
            self.emit_for(
                who.owner,
                "model:fallback_exhausted",
                json!({"agentId": who.agent_id, "models": chain, "reason": last.kind.as_str()}),
            );
        }
        Err(StepFailed {
            error: last,
            after_output: false,
        })
    }

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
