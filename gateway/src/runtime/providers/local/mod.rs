//! TEMPORARY stand-in for the local provider until its branch is merged.
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{
    BoxFuture, ChatRequest, ChatResponse, DeltaSink, Embeddings, ErrorKind, Provider, ProviderError,
};

pub const CHAT_MODEL_ID: &str = "smollm2-135m-instruct";
pub const EMBED_MODEL_ID: &str = "all-minilm-l6-v2";
pub const ENV_MODEL_CACHE: &str = "AGENT_GATEWAY_MODEL_CACHE";

pub struct LocalOptions {
    pub cache_dir: PathBuf,
    pub auto_fetch: bool,
    pub python: String,
    pub threads: Option<usize>,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LocalStatus {
    NotStarted,
    Fetching,
    Loading,
    Ready,
    Failed(String),
}

pub fn default_cache_dir() -> PathBuf {
    PathBuf::from("/tmp")
}

pub async fn fetch_all(_opts: &LocalOptions) -> Result<(), String> {
    Err("not built".into())
}

pub async fn install_from_dir(_opts: &LocalOptions, _dir: &std::path::Path) -> Result<(), String> {
    Err("not built".into())
}

pub struct LocalProvider;

impl LocalProvider {
    pub fn new(_opts: LocalOptions) -> Arc<Self> {
        Arc::new(Self)
    }
    pub fn start(self: &Arc<Self>) {}
    pub fn status(&self) -> LocalStatus {
        LocalStatus::NotStarted
    }
    pub async fn wait_ready(&self, _t: Duration) -> Result<(), String> {
        Err("not built".into())
    }
}

impl Provider for LocalProvider {
    fn chat<'a>(
        &'a self,
        _r: &'a ChatRequest,
        _s: Option<&'a DeltaSink>,
        _c: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<ChatResponse, ProviderError>> {
        Box::pin(async { Err(ProviderError::new(ErrorKind::Unavailable, "not built")) })
    }
    fn embed<'a>(
        &'a self,
        _m: &'a str,
        _i: &'a [String],
        _c: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<Embeddings, ProviderError>> {
        Box::pin(async { Err(ProviderError::new(ErrorKind::Unavailable, "not built")) })
    }
}
