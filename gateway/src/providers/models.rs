//! The model catalogue: every model the configured providers offer, as `<provider>/<modelId>`,
//! with aliases, context window, prices (for cost accounting) and capabilities. Built-in facts
//! about well-known models fill in what configuration leaves out.

use crate::api::generated::types::{ModelsCapability as Cap, ModelsCatalogEntry};
use crate::config::engine::ModelConfig;
use crate::providers::{ProviderKind, Usage};

/// Price of cached input tokens as a share of the input price (the provider discount for
/// prompt-cache reads; Anthropic's is 10%, OpenAI's current models 10-25%).
pub const CACHED_INPUT_PRICE_SHARE: f64 = 0.1;

/// Context window assumed for a model nothing is known about.
pub const DEFAULT_CONTEXT_WINDOW: u64 = 8192;

/// One catalogue model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelInfo {
    pub provider: String,
    pub model_id: String,
    pub aliases: Vec<String>,
    pub context_window: u64,
    pub max_output_tokens: Option<u64>,
    pub input_price: f64,
    pub output_price: f64,
    pub capabilities: Vec<Cap>,
}

impl ModelInfo {
    /// `<provider>/<modelId>`.
    pub fn id(&self) -> String {
        format!("{}/{}", self.provider, self.model_id)
    }

    /// Estimated USD cost of a call's usage.
    pub fn cost(&self, u: &Usage) -> f64 {
        let cached = u.cached_input.min(u.input) as f64;
        let fresh = (u.input as f64) - cached;
        (fresh * self.input_price
            + cached * self.input_price * CACHED_INPUT_PRICE_SHARE
            + u.output as f64 * self.output_price)
            / 1_000_000.0
    }

    /// Estimated USD saved by the call's cached prompt tokens (what they would have cost at
    /// the full input price, less what they cost).
    pub fn cache_saving(&self, u: &Usage) -> f64 {
        let cached = u.cached_input.min(u.input) as f64;
        cached * self.input_price * (1.0 - CACHED_INPUT_PRICE_SHARE) / 1_000_000.0
    }

    pub fn can(&self, c: Cap) -> bool {
        self.capabilities.contains(&c)
    }

    pub fn entry(&self, available: bool) -> ModelsCatalogEntry {
        ModelsCatalogEntry {
            id: self.id(),
            provider: self.provider.clone(),
            model_id: self.model_id.clone(),
            aliases: self.aliases.clone(),
            context_window: self.context_window as i64,
            max_output_tokens: self.max_output_tokens.map(|v| v as i64),
            input_price_per_m_tok: self.input_price,
            output_price_per_m_tok: self.output_price,
            capabilities: self.capabilities.clone(),
            available,
        }
    }
}

const CHAT: &[Cap] = &[Cap::Chat, Cap::Tools, Cap::Streaming, Cap::JsonMode];

struct Known {
    kind: ProviderKind,
    id: &'static str,
    context: u64,
    max_out: Option<u64>,
    input: f64,
    output: f64,
    caps: &'static [Cap],
}

/// What is known about popular models (prices in USD per million tokens, late 2026 list
/// prices; configuration overrides any of it).
const KNOWN: &[Known] = &[
    Known {
        kind: ProviderKind::Local,
        id: "smollm2-135m-instruct",
        context: 8192,
        max_out: Some(1024),
        input: 0.0,
        output: 0.0,
        caps: &[Cap::Chat, Cap::Streaming],
    },
    Known {
        kind: ProviderKind::Local,
        id: "all-minilm-l6-v2",
        context: 256,
        max_out: None,
        input: 0.0,
        output: 0.0,
        caps: &[Cap::Embeddings],
    },
    Known {
        kind: ProviderKind::Openai,
        id: "gpt-4o-mini",
        context: 128_000,
        max_out: Some(16_384),
        input: 0.15,
        output: 0.6,
        caps: &[
            Cap::Chat,
            Cap::Tools,
            Cap::Streaming,
            Cap::JsonMode,
            Cap::Vision,
            Cap::PromptCache,
        ],
    },
    Known {
        kind: ProviderKind::Openai,
        id: "gpt-4o",
        context: 128_000,
        max_out: Some(16_384),
        input: 2.5,
        output: 10.0,
        caps: &[
            Cap::Chat,
            Cap::Tools,
            Cap::Streaming,
            Cap::JsonMode,
            Cap::Vision,
            Cap::PromptCache,
        ],
    },
    Known {
        kind: ProviderKind::Openai,
        id: "gpt-4.1",
        context: 1_047_576,
        max_out: Some(32_768),
        input: 2.0,
        output: 8.0,
        caps: &[
            Cap::Chat,
            Cap::Tools,
            Cap::Streaming,
            Cap::JsonMode,
            Cap::Vision,
            Cap::PromptCache,
        ],
    },
    Known {
        kind: ProviderKind::Openai,
        id: "gpt-4.1-mini",
        context: 1_047_576,
        max_out: Some(32_768),
        input: 0.4,
        output: 1.6,
        caps: &[
            Cap::Chat,
            Cap::Tools,
            Cap::Streaming,
            Cap::JsonMode,
            Cap::Vision,
            Cap::PromptCache,
        ],
    },
    Known {
        kind: ProviderKind::Openai,
        id: "text-embedding-3-small",
        context: 8191,
        max_out: None,
        input: 0.02,
        output: 0.0,
        caps: &[Cap::Embeddings],
    },
    Known {
        kind: ProviderKind::Anthropic,
        id: "claude-sonnet-4-5",
        context: 200_000,
        max_out: Some(64_000),
        input: 3.0,
        output: 15.0,
        caps: &[
            Cap::Chat,
            Cap::Tools,
            Cap::Streaming,
            Cap::Vision,
            Cap::Reasoning,
            Cap::PromptCache,
        ],
    },
    Known {
        kind: ProviderKind::Anthropic,
        id: "claude-haiku-4-5",
        context: 200_000,
        max_out: Some(64_000),
        input: 1.0,
        output: 5.0,
        caps: &[
            Cap::Chat,
            Cap::Tools,
            Cap::Streaming,
            Cap::Vision,
            Cap::PromptCache,
        ],
    },
    Known {
        kind: ProviderKind::Anthropic,
        id: "claude-opus-4-1",
        context: 200_000,
        max_out: Some(32_000),
        input: 15.0,
        output: 75.0,
        caps: &[
            Cap::Chat,
            Cap::Tools,
            Cap::Streaming,
            Cap::Vision,
            Cap::Reasoning,
            Cap::PromptCache,
        ],
    },
];

/// The models of one provider, with built-in facts and configured overrides applied.
pub fn models_of(
    provider: &str,
    kind: ProviderKind,
    model_ids: &[String],
    overrides: &[ModelConfig],
) -> Vec<ModelInfo> {
    model_ids
        .iter()
        .map(|mid| {
            let known = KNOWN.iter().find(|k| k.kind == kind && k.id == mid);
            let mut m = ModelInfo {
                provider: provider.to_owned(),
                model_id: mid.clone(),
                aliases: Vec::new(),
                context_window: known.map_or(DEFAULT_CONTEXT_WINDOW, |k| k.context),
                max_output_tokens: known.and_then(|k| k.max_out),
                input_price: known.map_or(0.0, |k| k.input),
                output_price: known.map_or(0.0, |k| k.output),
                capabilities: known.map_or_else(
                    || match kind {
                        ProviderKind::Scripted => {
                            let mut c = CHAT.to_vec();
                            c.push(Cap::Embeddings);
                            c
                        }
                        _ => CHAT.to_vec(),
                    },
                    |k| k.caps.to_vec(),
                ),
            };
            let id = m.id();
            if let Some(o) = overrides.iter().find(|o| o.id == id) {
                m.aliases = o.aliases.clone();
                if let Some(v) = o.context_window {
                    m.context_window = v.max(1);
                }
                if o.max_output_tokens.is_some() {
                    m.max_output_tokens = o.max_output_tokens;
                }
                if let Some(v) = o.input_price_per_m_tok {
                    m.input_price = v.max(0.0);
                }
                if let Some(v) = o.output_price_per_m_tok {
                    m.output_price = v.max(0.0);
                }
                if let Some(c) = &o.capabilities {
                    m.capabilities = c.clone();
                }
            }
            m
        })
        .collect()
}

/// Finds a model by full id, alias, or bare model id (when exactly one provider offers it).
pub fn resolve<'a>(models: &'a [ModelInfo], name: &str) -> Option<&'a ModelInfo> {
    if let Some((p, mid)) = name.split_once('/') {
        if let Some(m) = models.iter().find(|m| m.provider == p && m.model_id == mid) {
            return Some(m);
        }
    }
    if let Some(m) = models.iter().find(|m| m.aliases.iter().any(|a| a == name)) {
        return Some(m);
    }
    let mut bare = models.iter().filter(|m| m.model_id == name);
    match (bare.next(), bare.next()) {
        (Some(m), None) => Some(m),
        _ => None,
    }
}
