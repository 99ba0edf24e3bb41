//! The local embedding model: all-MiniLM-L6-v2 (candle's BERT) with its tokenizer.json;
//! mean pooling over the attention mask, then L2 normalisation (384 dimensions).

use std::path::Path;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config};
use tokenizers::{PaddingParams, PaddingStrategy, Tokenizer, TruncationParams};
use tokio_util::sync::CancellationToken;

use crate::providers::{Embeddings, ErrorKind, ProviderError};

/// Inputs are truncated to this many tokens (including [CLS] and [SEP]).
pub const MAX_INPUT_TOKENS: usize = 256;
/// Inputs embedded per forward pass.
const BATCH: usize = 16;

/// A loaded embedding model. Inference is stateless; the lock keeps one batch at a time so
/// concurrent calls do not fight over the cores.
pub struct EmbedModel {
    model: BertModel,
    tokenizer: Tokenizer,
    pub dims: usize,
    pub lock: std::sync::Arc<tokio::sync::Mutex<()>>,
}

fn cerr(what: &str) -> impl Fn(candle_core::Error) -> ProviderError + '_ {
    move |e| ProviderError::new(ErrorKind::ProviderError, format!("{what}: {e}"))
}

impl EmbedModel {
    /// Loads config.json, model.safetensors and tokenizer.json from `dir` (blocking).
    pub fn load(dir: &Path) -> Result<Self, String> {
        let config_path = dir.join("config.json");
        let config_text = std::fs::read_to_string(&config_path)
            .map_err(|e| format!("{}: {e}", config_path.display()))?;
        let config: Config = serde_json::from_str(&config_text)
            .map_err(|e| format!("{}: {e}", config_path.display()))?;
        let weights_path = dir.join("model.safetensors");
        let weights =
            std::fs::read(&weights_path).map_err(|e| format!("{}: {e}", weights_path.display()))?;
        let device = Device::Cpu;
        let vb = VarBuilder::from_buffered_safetensors(weights, DType::F32, &device)
            .map_err(|e| format!("{}: {e}", weights_path.display()))?;
        let model = BertModel::load(vb, &config)
            .map_err(|e| format!("{}: loading BERT: {e}", weights_path.display()))?;
        let tok_path = dir.join("tokenizer.json");
        let mut tokenizer =
            Tokenizer::from_file(&tok_path).map_err(|e| format!("{}: {e}", tok_path.display()))?;
        tokenizer
            .with_truncation(Some(TruncationParams {
                max_length: MAX_INPUT_TOKENS,
                ..Default::default()
            }))
            .map_err(|e| format!("{}: {e}", tok_path.display()))?;
        let pad_id = tokenizer.token_to_id("[PAD]").unwrap_or(0);
        tokenizer.with_padding(Some(PaddingParams {
            strategy: PaddingStrategy::BatchLongest,
            pad_id,
            pad_token: "[PAD]".to_string(),
            ..Default::default()
        }));
        Ok(Self {
            model,
            tokenizer,
            dims: config.hidden_size,
            lock: std::sync::Arc::new(tokio::sync::Mutex::new(())),
        })
    }

    /// Unit-length embeddings of `inputs`, in order (blocking). `cancel` is checked between
    /// batches.
    pub fn embed(
        &self,
        inputs: &[String],
        cancel: &CancellationToken,
    ) -> Result<Embeddings, ProviderError> {
        let mut vectors = Vec::with_capacity(inputs.len());
        let mut input_tokens = 0u64;
        for chunk in inputs.chunks(BATCH) {
            if cancel.is_cancelled() {
                return Err(ProviderError::new(
                    ErrorKind::Cancelled,
                    "local embedding cancelled",
                ));
            }
            let (batch, tokens) = self.embed_batch(chunk)?;
            vectors.extend(batch);
            input_tokens += tokens;
        }
        Ok(Embeddings {
            vectors,
            input_tokens,
        })
    }

    fn embed_batch(&self, inputs: &[String]) -> Result<(Vec<Vec<f32>>, u64), ProviderError> {
        let encodings = self
            .tokenizer
            .encode_batch(inputs.to_vec(), true)
            .map_err(|e| {
                ProviderError::new(ErrorKind::InvalidRequest, format!("tokenizing: {e}"))
            })?;
        let rows = encodings.len();
        let cols = encodings.first().map_or(0, |e| e.get_ids().len());
        let mut ids = Vec::with_capacity(rows * cols);
        let mut mask = Vec::with_capacity(rows * cols);
        for enc in &encodings {
            ids.extend_from_slice(enc.get_ids());
            mask.extend_from_slice(enc.get_attention_mask());
        }
        if ids.len() != rows * cols || mask.len() != rows * cols {
            return Err(ProviderError::new(
                ErrorKind::ProviderError,
                "tokenizer returned ragged batch",
            ));
        }
        let tokens: u64 = mask.iter().map(|m| u64::from(*m)).sum();
        let device = &self.model.device;
        let ids = Tensor::from_vec(ids, (rows, cols), device).map_err(cerr("ids"))?;
        let mask = Tensor::from_vec(mask, (rows, cols), device).map_err(cerr("mask"))?;
        let type_ids = ids.zeros_like().map_err(cerr("type ids"))?;
        let hidden = self
            .model
            .forward(&ids, &type_ids, Some(&mask))
            .map_err(cerr("BERT forward"))?;
        let pooled = (|| {
            let m = mask.to_dtype(DType::F32)?.unsqueeze(2)?;
            let summed = hidden.broadcast_mul(&m)?.sum(1)?;
            let counts = m.sum(1)?.clamp(1e-9f32, f32::MAX)?;
            let mean = summed.broadcast_div(&counts)?;
            let norm = mean
                .sqr()?
                .sum_keepdim(1)?
                .sqrt()?
                .clamp(1e-12f32, f32::MAX)?;
            mean.broadcast_div(&norm)?.to_vec2::<f32>()
        })()
        .map_err(cerr("pooling"))?;
        Ok((pooled, tokens))
    }
}
