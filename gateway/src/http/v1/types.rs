//! The `/v1` wire types (the spec's "Chat completion request/response/chunk", "Model
//! object", "Embeddings" and the Responses format). Request types are strict: an unknown
//! field is a 400. Response types also derive serde so that stream frames are written
//! without an intermediate JSON tree.

use poem_openapi::types::Any;
use poem_openapi::{Enum, Object};

use crate::http::either::either;
use crate::http::strict_json::Validate;
use crate::transport::problem::Problem;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Enum, Deserialize)]
#[oai(rename_all = "lowercase", rename = "ChatRole")]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
}

/// One block of a content array. Only `text` blocks are supported; `image_url` is refused
/// with a 400 that says so.
#[derive(Debug, Clone, PartialEq, Object, Serialize, Deserialize)]
#[oai(rename = "ChatContentPart")]
pub struct ContentPart {
    /// `text` (or `image_url`, which this endpoint refuses).
    #[oai(rename = "type")]
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
    #[serde(default, deserialize_with = "any_value")]
    pub image_url: Option<Any<Value>>,
}

/// Any JSON value (`Any` has no serde of its own for reading).
fn any_value<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Any<Value>>, D::Error> {
    Option::<Value>::deserialize(d).map(|v| v.map(Any))
}

either! {
    /// A string, or an array of content blocks.
    Content as "ChatContent" { Text(String), Parts(Vec<ContentPart>) }
}

impl<'de> Deserialize<'de> for Content {
    /// A string or an array of blocks, read in place (no buffering to try each shape).
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Shape;
        impl<'de> serde::de::Visitor<'de> for Shape {
            type Value = Content;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string or an array of content blocks")
            }

            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Content, E> {
                Ok(Content::Text(v.to_owned()))
            }

            fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Content, E> {
                Ok(Content::Text(v))
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, seq: A) -> Result<Content, A::Error> {
                Vec::<ContentPart>::deserialize(serde::de::value::SeqAccessDeserializer::new(seq))
                    .map(Content::Parts)
            }
        }
        d.deserialize_any(Shape)
    }
}

#[derive(Debug, Clone, Object, Deserialize)]
#[oai(rename = "ChatMessage", deny_unknown_fields)]
#[serde(deny_unknown_fields)]
pub struct ChatMessageIn {
    pub role: Role,
    pub content: Content,
}

#[derive(Debug, Clone, Object, Deserialize)]
#[oai(rename = "StreamOptions", deny_unknown_fields)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    /// Adds a chunk with empty `choices` and the token usage before `[DONE]`.
    #[serde(default)]
    pub include_usage: Option<bool>,
}

// Parsed with serde (`http::strict_json`); the validators below document the rules that its
// `Validate` impl applies.
/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, Object, Deserialize)]
#[oai(rename = "ChatCompletionRequest", deny_unknown_fields)]
#[serde(deny_unknown_fields)]
pub struct ChatCompletionRequest {
    /// `<provider>/<model>`, a bare model id, an alias, or an agent id.
    #[oai(validator(min_length = 1))]
    pub model: String,
    #[oai(validator(min_items = 1))]
    pub messages: Vec<ChatMessageIn>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[oai(validator(minimum(value = "0"), maximum(value = "2")))]
    #[serde(default)]
    pub temperature: Option<f64>,
    #[oai(validator(minimum(value = "1"), maximum(value = "4294967295")))]
    #[serde(default)]
    pub max_tokens: Option<u64>,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
}

impl Validate for ChatCompletionRequest {
    fn validate(&self) -> Result<(), Problem> {
        if self.model.is_empty() {
            return Err(Problem::invalid_param("model", "'model' must not be empty"));
        }
        if self.messages.is_empty() {
            return Err(Problem::invalid_param(
                "messages",
                "'messages' must hold at least one message",
            ));
        }
        if self.temperature.is_some_and(|t| !(0.0..=2.0).contains(&t)) {
            return Err(Problem::invalid_param(
                "temperature",
                "'temperature' must be between 0 and 2",
            ));
        }
        if self
            .max_tokens
            .is_some_and(|m| !(1..=u64::from(u32::MAX)).contains(&m))
        {
            return Err(Problem::invalid_param(
                "max_tokens",
                "'max_tokens' must be an integer from 1 to 4294967295",
            ));
        }
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq, Object, Serialize)]
#[oai(rename = "CompletionUsage")]
pub struct CompletionUsage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub total_tokens: u64,
}

#[derive(Debug, Clone, Object, Serialize)]
#[oai(rename = "AssistantMessage")]
pub struct AssistantMessage {
    /// Always `assistant`.
    pub role: String,
    #[oai(nullable)]
    pub content: Option<String>,
}

#[derive(Debug, Clone, Object, Serialize)]
#[oai(rename = "ChatCompletionChoice")]
pub struct Choice {
    pub index: u32,
    pub message: AssistantMessage,
    /// `stop` or `length` (the spec's finish reason mapping).
    pub finish_reason: String,
}

/// A non-streaming answer.
#[derive(Debug, Clone, Object, Serialize)]
#[oai(rename = "ChatCompletion")]
pub struct ChatCompletion {
    /// `chatcmpl-<uuid>`.
    pub id: String,
    /// Always `chat.completion`.
    pub object: String,
    /// Unix seconds.
    pub created: i64,
    /// The model as the request named it.
    pub model: String,
    pub choices: Vec<Choice>,
    pub usage: CompletionUsage,
}

#[derive(Debug, Clone, Default, Object, Serialize)]
#[oai(rename = "ChatCompletionDelta", skip_serializing_if_is_none)]
pub struct Delta {
    /// `assistant`, in the first chunk only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// Text, in content chunks only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
}

#[derive(Debug, Clone, Object, Serialize)]
#[oai(rename = "ChatCompletionChunkChoice")]
pub struct ChunkChoice {
    pub index: u32,
    pub delta: Delta,
    /// Null until the finish chunk.
    #[oai(nullable)]
    pub finish_reason: Option<String>,
}

/// One streamed chunk; the stream ends with the data line `[DONE]`.
#[derive(Debug, Clone, Object, Serialize)]
#[oai(rename = "ChatCompletionChunk")]
pub struct ChatCompletionChunk {
    /// The same `chatcmpl-<uuid>` for every chunk of a completion.
    pub id: String,
    /// Always `chat.completion.chunk`.
    pub object: String,
    pub created: i64,
    pub model: String,
    /// One element, or none in the usage chunk.
    pub choices: Vec<ChunkChoice>,
    /// Only in the usage chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[oai(skip_serializing_if_is_none)]
    pub usage: Option<CompletionUsage>,
}

/// An entry of `/v1/models`.
#[derive(Debug, Clone, Object, Serialize)]
#[oai(rename = "Model")]
pub struct ModelObject {
    /// `<provider>/<modelId>`.
    pub id: String,
    /// Always `model`.
    pub object: String,
    /// Always 0.
    pub created: i64,
    /// The provider's name.
    pub owned_by: String,
}

#[derive(Debug, Clone, Object, Serialize)]
#[oai(rename = "ModelList")]
pub struct ModelList {
    /// Always `list`.
    pub object: String,
    pub data: Vec<ModelObject>,
}

either! {
    /// One string or several.
    EmbeddingInput as "EmbeddingInput" { One(String), Many(Vec<String>) }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Enum)]
#[oai(rename_all = "lowercase", rename = "EncodingFormat")]
pub enum EncodingFormat {
    Float,
    Base64,
}

/// `POST /v1/embeddings`.
#[derive(Debug, Clone, Object)]
#[oai(rename = "EmbeddingRequest", deny_unknown_fields)]
pub struct EmbeddingRequest {
    /// An embedding model: `<provider>/<model>`, a bare model id or an alias.
    #[oai(validator(min_length = 1))]
    pub model: String,
    pub input: EmbeddingInput,
    /// `float` (default) or `base64` (little-endian f32, as the OpenAI SDKs decode it).
    pub encoding_format: Option<EncodingFormat>,
    /// Accepted and ignored.
    pub user: Option<String>,
}

either! {
    /// A vector as numbers, or as base64 of little-endian f32.
    EmbeddingVector as "EmbeddingVector" { Float(Vec<f32>), Base64(String) }
}

#[derive(Debug, Clone, Object, Serialize)]
#[oai(rename = "Embedding")]
pub struct EmbeddingObject {
    /// Always `embedding`.
    pub object: String,
    pub embedding: EmbeddingVector,
    /// Position in the input.
    pub index: u32,
}

#[derive(Debug, Clone, Object, Serialize)]
#[oai(rename = "EmbeddingUsage")]
pub struct EmbeddingUsage {
    /// ceil(characters / 4) over the inputs.
    pub prompt_tokens: u64,
    pub total_tokens: u64,
}

#[derive(Debug, Clone, Object, Serialize)]
#[oai(rename = "EmbeddingList")]
pub struct EmbeddingList {
    /// Always `list`.
    pub object: String,
    pub data: Vec<EmbeddingObject>,
    /// The embedding model that answered.
    pub model: String,
    pub usage: EmbeddingUsage,
}
