//! The OpenAI-compatible API under `/v1`: chat completions (JSON or SSE), models,
//! embeddings and responses. Every request is its own ephemeral turn (nothing carries over),
//! every failure the spec's error body (see `http::problem`).

pub mod chat;
pub mod responses;
pub mod types;

use std::sync::Arc;

use base64::Engine as _;
use poem::web::Data;
use poem_openapi::param::Path;
use poem_openapi::payload::Json;
use poem_openapi::{OpenApi, Tags};
use tokio_util::sync::CancellationToken;

use crate::app::state::AppState;
use crate::http::security::V1Auth;
use crate::http::strict_json::StrictJson;
use crate::runtime::calls::EmbedError;
use crate::transport::problem::{Problem, V1Error};
use types::*;

#[derive(Tags)]
enum V1Tag {
    /// The OpenAI-compatible API: point an OpenAI SDK's base URL at `/v1`.
    Compatible,
}

pub struct V1Api;

/// Tokens of a text as the spec estimates them: ceil(characters / 4).
pub fn estimate_tokens(text: &str) -> u64 {
    (text.chars().count() as u64).div_ceil(4)
}

fn model_object(id: String, provider: &str) -> ModelObject {
    ModelObject {
        id,
        object: "model".to_owned(),
        created: 0,
        owned_by: provider.to_owned(),
    }
}

/// The catalogue models whose provider is enabled, as `/v1/models` lists them.
fn listed_models(state: &AppState) -> Vec<ModelObject> {
    let snap = state.engine.providers.snapshot();
    snap.models
        .iter()
        .filter(|m| snap.providers.get(&m.provider).is_some_and(|p| p.enabled()))
        .map(|m| model_object(m.id(), &m.provider))
        .collect()
}

fn find_model(state: &AppState, id: &str) -> Result<Json<ModelObject>, V1Error> {
    listed_models(state)
        .into_iter()
        .find(|m| m.id == id)
        .map(Json)
        .ok_or_else(|| Problem::not_found("Model not found").into())
}

#[OpenApi(prefix_path = "/v1", tag = "V1Tag::Compatible")]
impl V1Api {
    /// Chat completion
    ///
    /// Runs one ephemeral agent turn. `model` is `<provider>/<model>`, a bare model id or an
    /// alias (the default agent runs on that model), or an agent id. With `stream: true` the
    /// answer is an event stream: a role chunk, one chunk per text delta, a finish chunk, a
    /// usage chunk when `stream_options.include_usage` is true, then `data: [DONE]`.
    #[oai(
        path = "/chat/completions",
        method = "post",
        operation_id = "createChatCompletion"
    )]
    async fn chat_completions(
        &self,
        auth: V1Auth,
        Data(state): Data<&Arc<AppState>>,
        body: StrictJson<ChatCompletionRequest>,
    ) -> Result<chat::ChatCompletionResponse, V1Error> {
        chat::complete(state, &auth.0, body.0).await
    }

    /// List models
    #[oai(path = "/models", method = "get", operation_id = "listModels")]
    async fn models(
        &self,
        _auth: V1Auth,
        Data(state): Data<&Arc<AppState>>,
    ) -> Result<Json<ModelList>, V1Error> {
        Ok(Json(ModelList {
            object: "list".to_owned(),
            data: listed_models(state),
        }))
    }

    /// Retrieve a model by its encoded id
    ///
    /// The id with its slash percent-encoded (`/v1/models/local%2Fsmollm2-135m-instruct`), as
    /// the OpenAI SDKs send it.
    #[oai(
        path = "/models/:model_id",
        method = "get",
        operation_id = "retrieveModelEncoded"
    )]
    async fn model_encoded(
        &self,
        _auth: V1Auth,
        Data(state): Data<&Arc<AppState>>,
        model_id: Path<String>,
    ) -> Result<Json<ModelObject>, V1Error> {
        find_model(state, &model_id.0)
    }

    /// Retrieve a model
    ///
    /// The id contains a slash: `/v1/models/<provider>/<modelId>`.
    #[oai(
        path = "/models/:provider/:model",
        method = "get",
        operation_id = "retrieveModel"
    )]
    async fn model(
        &self,
        _auth: V1Auth,
        Data(state): Data<&Arc<AppState>>,
        provider: Path<String>,
        model: Path<String>,
    ) -> Result<Json<ModelObject>, V1Error> {
        find_model(state, &format!("{}/{}", provider.0, model.0))
    }

    /// Create embeddings
    ///
    /// `encoding_format: base64` returns each vector as base64 of little-endian f32 (what
    /// the OpenAI SDKs ask for by default).
    #[oai(
        path = "/embeddings",
        method = "post",
        operation_id = "createEmbedding"
    )]
    async fn embeddings(
        &self,
        _auth: V1Auth,
        Data(state): Data<&Arc<AppState>>,
        body: Json<EmbeddingRequest>,
    ) -> Result<Json<EmbeddingList>, V1Error> {
        let req = body.0;
        let inputs = match req.input {
            EmbeddingInput::One(s) => vec![s],
            EmbeddingInput::Many(v) => v,
        };
        if inputs.is_empty() {
            return Err(Problem::invalid_param("input", "'input' must not be empty").into());
        }
        if inputs.len() > 2048 {
            return Err(
                Problem::invalid_param("input", "'input' may hold at most 2048 strings").into(),
            );
        }
        let cancel = CancellationToken::new();
        let _cancel_on_drop = cancel.clone().drop_guard();
        let (model, out) = match state.engine.calls.embed(&req.model, &inputs, &cancel).await {
            Ok(v) => v,
            Err(EmbedError::NoEmbeddingProvider) => {
                return Err(Problem::not_found("No embedding provider configured").into())
            }
            Err(EmbedError::ModelNotFound) => {
                return Err(Problem::not_found(format!("Model not found: {}", req.model)).into())
            }
            Err(EmbedError::Failed(e)) => return Err(e.into()),
        };
        let base64 = req.encoding_format == Some(EncodingFormat::Base64);
        let data = out
            .vectors
            .into_iter()
            .enumerate()
            .map(|(i, v)| EmbeddingObject {
                object: "embedding".to_owned(),
                embedding: if base64 {
                    let bytes: Vec<u8> = v.iter().flat_map(|f| f.to_le_bytes()).collect();
                    EmbeddingVector::Base64(base64::engine::general_purpose::STANDARD.encode(bytes))
                } else {
                    EmbeddingVector::Float(v)
                },
                index: i as u32,
            })
            .collect();
        let prompt_tokens = inputs.iter().map(|s| estimate_tokens(s)).sum();
        Ok(Json(EmbeddingList {
            object: "list".to_owned(),
            data,
            model: model.id(),
            usage: EmbeddingUsage {
                prompt_tokens,
                total_tokens: prompt_tokens,
            },
        }))
    }

    /// Create a response (Responses format)
    ///
    /// `input` is a string or a list of messages; `instructions` and system/developer
    /// messages are the system prompt. With `stream: true` the answer is the Responses event
    /// stream (`response.created` ... `response.output_text.delta` ... `response.completed`).
    #[oai(path = "/responses", method = "post", operation_id = "createResponse")]
    async fn responses(
        &self,
        auth: V1Auth,
        Data(state): Data<&Arc<AppState>>,
        body: Json<responses::ResponsesRequest>,
    ) -> Result<responses::ResponsesResponse, V1Error> {
        responses::create(state, &auth.0, body.0).await
    }
}
