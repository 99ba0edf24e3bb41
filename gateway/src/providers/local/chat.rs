//! The local chat model: SmolLM2-135M-Instruct from GGUF (candle's quantized llama), its
//! ChatML prompt with trimming to the context, and token-by-token generation (greedy, or
//! seeded sampling with a temperature) that streams text and stops on cancellation.

use std::path::Path;

use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};
use candle_transformers::generation::{LogitsProcessor, Sampling};
use candle_transformers::models::quantized_llama::{ModelWeights, MAX_SEQ_LEN};
use tokio_util::sync::CancellationToken;

use super::tokenizer::{GgufTokenizer, Utf8Stream};
use crate::providers::{
    ChatRequest, ChatResponse, DeltaSink, ErrorKind, ProviderError, Role, StopReason, Usage,
};

/// Output tokens when the request gives no limit.
pub const DEFAULT_MAX_TOKENS: u32 = 256;
/// Upper bound on output tokens per call.
pub const MAX_TOKENS_CAP: u32 = 1024;
/// Seed of the sampler when a temperature is given (runs are repeatable).
const SAMPLING_SEED: u64 = 0x5EED_5A11_0C41;
/// SmolLM2's chat template uses this system prompt when none is given.
const DEFAULT_SYSTEM: &str = "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

/// A loaded chat model. The weights (which hold the KV cache) sit behind an async mutex:
/// one generation at a time.
pub struct ChatModel {
    pub weights: std::sync::Arc<tokio::sync::Mutex<ModelWeights>>,
    tokenizer: GgufTokenizer,
    im_start: u32,
    im_end: u32,
    eos: u32,
    /// Usable context (the model's, capped by candle's rotary table).
    pub context: usize,
    device: Device,
}

fn cerr(what: &str) -> impl Fn(candle_core::Error) -> ProviderError + '_ {
    move |e| ProviderError::new(ErrorKind::ProviderError, format!("{what}: {e}"))
}

/// How the quantized weights are held in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightFormat {
    /// As stored in the file (Q4_1).
    AsStored,
    /// Re-quantized to Q8_0.
    Q8_0,
    /// Dequantized to f32.
    F32,
}

/// Rewrites every quantized tensor of `content` into `target`, as an in-memory GGUF.
fn convert_weights(
    content: &gguf_file::Content,
    file: &mut std::fs::File,
    target: GgmlDType,
) -> Result<(gguf_file::Content, std::io::Cursor<Vec<u8>>), String> {
    let device = Device::Cpu;
    let mut names: Vec<&String> = content.tensor_infos.keys().collect();
    names.sort();
    let mut tensors = Vec::with_capacity(names.len());
    for name in names {
        let qt = content
            .tensor(file, name, &device)
            .map_err(|e| format!("reading {name}: {e}"))?;
        let keep = matches!(
            qt.dtype(),
            GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16
        ) || qt.dtype() == target;
        let qt = if keep {
            qt
        } else {
            let t = qt
                .dequantize(&device)
                .map_err(|e| format!("dequantizing {name}: {e}"))?;
            QTensor::quantize(&t, target).map_err(|e| format!("converting {name}: {e}"))?
        };
        tensors.push((name.as_str(), qt));
    }
    let metadata: Vec<(&str, &gguf_file::Value)> = content
        .metadata
        .iter()
        .map(|(k, v)| (k.as_str(), v))
        .collect();
    let refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(n, t)| (*n, t)).collect();
    let mut buf = std::io::Cursor::new(Vec::new());
    gguf_file::write(&mut buf, &metadata, &refs).map_err(|e| format!("re-encoding: {e}"))?;
    buf.set_position(0);
    let converted = gguf_file::Content::read(&mut buf).map_err(|e| format!("re-reading: {e}"))?;
    Ok((converted, buf))
}

/// Which turns fit in `budget` tokens besides `fixed` ones (system prompt and assistant
/// header): drops the oldest turns, always keeping the last one. Ok((index of the first kept
/// turn, total tokens)), or Err(tokens needed) when even the last turn alone does not fit.
fn fit_turns(fixed: usize, turns: &[usize], budget: usize) -> Result<(usize, usize), usize> {
    let mut total = fixed + turns.iter().sum::<usize>();
    let mut first = 0;
    while total > budget && turns.len() - first > 1 {
        total -= turns[first];
        first += 1;
    }
    if total > budget {
        Err(total)
    } else {
        Ok((first, total))
    }
}

impl ChatModel {
    /// Reads the GGUF file, its tokenizer and weights (blocking). The weights are
    /// dequantized to f32: candle's quantized matmul also quantizes the activations to 8 bits,
    /// which derails this small model (it no longer knows the capital of France, while f32
    /// matches a reference forward pass), and on a default x86-64 build (no AVX enabled at
    /// compile time) its quantized kernels are slower than f32 gemm anyway.
    pub fn load(path: &Path) -> Result<Self, String> {
        Self::load_with(path, WeightFormat::F32)
    }

    /// Reads the GGUF file, holding the weights as `weight_format` says (blocking).
    pub fn load_with(path: &Path, weight_format: WeightFormat) -> Result<Self, String> {
        let mut file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let content = gguf_file::Content::read(&mut file)
            .map_err(|e| format!("{}: not a readable GGUF file: {e}", path.display()))?;
        let arch = content
            .metadata
            .get("general.architecture")
            .and_then(|v| v.to_string().ok())
            .cloned()
            .unwrap_or_default();
        if arch != "llama" {
            return Err(format!(
                "{}: architecture {arch:?} is not llama",
                path.display()
            ));
        }
        let model_context = content
            .metadata
            .get("llama.context_length")
            .and_then(|v| v.to_u32().ok())
            .map(|v| v as usize)
            .unwrap_or(2048);
        let tokenizer = GgufTokenizer::from_gguf(&content)?;
        let im_start = tokenizer
            .token_id("<|im_start|>")
            .ok_or("the vocabulary has no <|im_start|>")?;
        let im_end = tokenizer
            .token_id("<|im_end|>")
            .ok_or("the vocabulary has no <|im_end|>")?;
        let eos = tokenizer.eos_id;
        let device = Device::Cpu;
        let target = match weight_format {
            WeightFormat::AsStored => None,
            WeightFormat::Q8_0 => Some(GgmlDType::Q8_0),
            WeightFormat::F32 => Some(GgmlDType::F32),
        };
        let weights = match target {
            None => ModelWeights::from_gguf(content, &mut file, &device),
            Some(target) => {
                let (converted, mut buf) = convert_weights(&content, &mut file, target)
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                ModelWeights::from_gguf(converted, &mut buf, &device)
            }
        }
        .map_err(|e| format!("{}: loading weights: {e}", path.display()))?;
        Ok(Self {
            weights: std::sync::Arc::new(tokio::sync::Mutex::new(weights)),
            tokenizer,
            im_start,
            im_end,
            eos,
            context: model_context.min(MAX_SEQ_LEN),
            device,
        })
    }

    /// The output token limit of a request: default 256, at most 1024, at least 1.
    pub fn max_new_tokens(req: &ChatRequest) -> usize {
        req.max_tokens
            .unwrap_or(DEFAULT_MAX_TOKENS)
            .clamp(1, MAX_TOKENS_CAP) as usize
    }

    fn turn(&self, role: &str, content: &str) -> Result<Vec<u32>, ProviderError> {
        let invalid = |e: String| ProviderError::new(ErrorKind::InvalidRequest, e);
        let mut ids = vec![self.im_start];
        ids.extend(
            self.tokenizer
                .encode(&format!("{role}\n{content}"))
                .map_err(invalid)?,
        );
        ids.push(self.im_end);
        ids.extend(self.tokenizer.encode("\n").map_err(invalid)?);
        Ok(ids)
    }

    /// The ChatML prompt of `req`, ending with the assistant header. When it does not fit in
    /// `context - max_new` tokens, the oldest messages are dropped (the system prompt and the
    /// last message are always kept; if those alone do not fit the request is refused).
    pub fn build_prompt(
        &self,
        req: &ChatRequest,
        max_new: usize,
    ) -> Result<Vec<u32>, ProviderError> {
        let system = req
            .system
            .as_deref()
            .filter(|s| !s.trim().is_empty())
            .unwrap_or(DEFAULT_SYSTEM);
        let head = self.turn("system", system)?;
        let mut turns = Vec::with_capacity(req.messages.len());
        for m in &req.messages {
            let (role, text) = match m.role {
                Role::User => ("user", m.content.clone()),
                Role::Assistant => {
                    let mut text = m.content.clone();
                    for call in &m.tool_calls {
                        if !text.is_empty() {
                            text.push('\n');
                        }
                        text.push_str(&format!(
                            "[called tool {} with {}]",
                            call.name, call.arguments
                        ));
                    }
                    ("assistant", text)
                }
                // SmolLM2 knows no tool role: a tool result is shown to it as user text.
                Role::Tool => {
                    let name = m.tool_name.as_deref().unwrap_or("tool");
                    let label = if m.is_error {
                        "error from tool"
                    } else {
                        "result of tool"
                    };
                    ("user", format!("[{label} {name}]\n{}", m.content))
                }
            };
            turns.push(self.turn(role, &text)?);
        }
        let mut tail = vec![self.im_start];
        tail.extend(
            self.tokenizer
                .encode("assistant\n")
                .map_err(|e| ProviderError::new(ErrorKind::InvalidRequest, e))?,
        );

        let budget = self.context.saturating_sub(max_new);
        let lens: Vec<usize> = turns.iter().map(Vec::len).collect();
        let (first, total) =
            fit_turns(head.len() + tail.len(), &lens, budget).map_err(|total| {
                ProviderError::new(
                    ErrorKind::InvalidRequest,
                    format!(
                    "the prompt needs {total} tokens but the local model has room for {budget} \
                     ({} context - {max_new} output tokens)",
                    self.context
                ),
                )
            })?;
        if first > 0 {
            tracing::debug!(
                dropped = first,
                "local chat: oldest messages dropped to fit the context"
            );
        }
        let mut ids = Vec::with_capacity(total);
        ids.extend(head);
        for t in turns.into_iter().skip(first) {
            ids.extend(t);
        }
        ids.extend(tail);
        Ok(ids)
    }

    /// Generates up to `max_new` tokens after `prompt` (blocking). Each complete piece of text
    /// is sent to `sink` as it is produced; `cancel` is checked between tokens.
    pub fn generate(
        &self,
        weights: &mut ModelWeights,
        prompt: &[u32],
        max_new: usize,
        temperature: Option<f64>,
        sink: Option<&DeltaSink>,
        cancel: &CancellationToken,
    ) -> Result<ChatResponse, ProviderError> {
        let cancelled = || ProviderError::new(ErrorKind::Cancelled, "local generation cancelled");
        if cancel.is_cancelled() {
            return Err(cancelled());
        }
        let sampling = match temperature {
            Some(t) if t > 0.0 && t.is_finite() => Sampling::All { temperature: t },
            _ => Sampling::ArgMax,
        };
        let mut sampler = LogitsProcessor::from_sampling(SAMPLING_SEED, sampling);
        let input = Tensor::new(prompt, &self.device)
            .and_then(|t| t.unsqueeze(0))
            .map_err(cerr("prompt tensor"))?;
        // index_pos 0 makes every layer start a fresh KV cache.
        let mut logits = weights.forward(&input, 0).map_err(cerr("prompt"))?;
        let mut stream = Utf8Stream::default();
        let mut content = String::new();
        let emit = |piece: String, content: &mut String| {
            if piece.is_empty() {
                return;
            }
            if let Some(sink) = sink {
                let _ = sink.send(piece.clone());
            }
            content.push_str(&piece);
        };
        let mut generated = 0usize;
        let stop = loop {
            if cancel.is_cancelled() {
                return Err(cancelled());
            }
            let next = logits
                .squeeze(0)
                .and_then(|l| l.to_dtype(DType::F32))
                .and_then(|l| sampler.sample(&l))
                .map_err(cerr("sampling"))?;
            // <|im_start|> would open another turn: the answer is over as well.
            if next == self.eos || next == self.im_end || next == self.im_start {
                break StopReason::Stop;
            }
            generated += 1;
            emit(stream.push(self.tokenizer.bytes_of(next)), &mut content);
            if generated >= max_new || prompt.len() + generated >= self.context {
                break StopReason::Length;
            }
            if cancel.is_cancelled() {
                return Err(cancelled());
            }
            let input = Tensor::new(&[next], &self.device)
                .and_then(|t| t.unsqueeze(0))
                .map_err(cerr("token tensor"))?;
            logits = weights
                .forward(&input, prompt.len() + generated - 1)
                .map_err(cerr("decoding"))?;
        };
        emit(stream.finish(), &mut content);
        Ok(ChatResponse {
            content,
            tool_calls: Vec::new(),
            usage: Usage {
                input: prompt.len() as u64,
                output: generated as u64,
                ..Usage::default()
            },
            stop,
        })
    }

    /// The tokenizer (for tests and diagnostics).
    pub fn tokenizer(&self) -> &GgufTokenizer {
        &self.tokenizer
    }

    /// The text of token ids (for tests and diagnostics).
    pub fn decode(&self, ids: &[u32]) -> String {
        self.tokenizer.decode(ids)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oldest_turns_are_dropped_to_fit() {
        // Everything fits.
        assert_eq!(fit_turns(10, &[5, 5, 5], 100), Ok((0, 25)));
        // Drop the two oldest.
        assert_eq!(fit_turns(10, &[50, 30, 20, 5], 40), Ok((2, 35)));
        // The last turn is always kept; alone too big: refused with the size needed.
        assert_eq!(fit_turns(10, &[5, 50], 40), Err(60));
        // No turns at all.
        assert_eq!(fit_turns(10, &[], 40), Ok((0, 10)));
        assert_eq!(fit_turns(50, &[], 40), Err(50));
    }
}
