//! TEMPORARY stand-in until its branch is merged.
use tokio_util::sync::CancellationToken;

use super::{
    BoxFuture, ChatRequest, ChatResponse, DeltaSink, Embeddings, ErrorKind, Provider,
    ProviderError, ProviderSettings,
};

pub struct AnthropicProvider;

impl AnthropicProvider {
    pub fn new(_s: ProviderSettings) -> Result<Self, ProviderError> {
        Ok(Self)
    }
}

impl Provider for AnthropicProvider {
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
