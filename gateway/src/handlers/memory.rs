//! `memory.*`: long-term memory per tenant - search, management, portability, recall reports.

use super::Rpc;
use crate::error::GatewayError;
use crate::rpc::generated::handlers::MemoryApi;
use crate::rpc::generated::types::*;
use crate::rpc::CallContext;

impl MemoryApi for Rpc {
    async fn ask(&self, _ctx: &CallContext, _p: MemoryAskParams) -> Result<MemoryAskResult, GatewayError> {
        Err(GatewayError::Unavailable("not built yet".to_owned()))
    }
    async fn browse(&self, _ctx: &CallContext, _p: MemoryBrowseParams) -> Result<MemoryBrowseResult, GatewayError> {
        Err(GatewayError::Unavailable("not built yet".to_owned()))
    }
    async fn delete(&self, _ctx: &CallContext, _p: MemoryDeleteParams) -> Result<MemoryDeleteResult, GatewayError> {
        Err(GatewayError::Unavailable("not built yet".to_owned()))
    }
    async fn embedding_cache(&self, _ctx: &CallContext, _p: MemoryEmbeddingCacheParams) -> Result<MemoryEmbeddingCacheResult, GatewayError> {
        Err(GatewayError::Unavailable("not built yet".to_owned()))
    }
    async fn entities(&self, _ctx: &CallContext, _p: MemoryEntitiesParams) -> Result<MemoryEntitiesResult, GatewayError> {
        Err(GatewayError::Unavailable("not built yet".to_owned()))
    }
    async fn export(&self, _ctx: &CallContext, _p: MemoryExportParams) -> Result<MemoryExportResult, GatewayError> {
        Err(GatewayError::Unavailable("not built yet".to_owned()))
    }
    async fn flush(&self, _ctx: &CallContext, _p: MemoryFlushParams) -> Result<MemoryFlushResult, GatewayError> {
        Err(GatewayError::Unavailable("not built yet".to_owned()))
    }
    async fn get_file(&self, _ctx: &CallContext, _p: MemoryGetFileParams) -> Result<MemoryGetFileResult, GatewayError> {
        Err(GatewayError::Unavailable("not built yet".to_owned()))
    }
    async fn inspect(&self, _ctx: &CallContext, _p: MemoryInspectParams) -> Result<MemoryInspectResult, GatewayError> {
        Err(GatewayError::Unavailable("not built yet".to_owned()))
    }
    async fn observations(&self, _ctx: &CallContext, _p: MemoryObservationsParams) -> Result<MemoryObservationsResult, GatewayError> {
        Err(GatewayError::Unavailable("not built yet".to_owned()))
    }
    async fn pin(&self, _ctx: &CallContext, _p: MemoryPinParams) -> Result<MemoryPinResult, GatewayError> {
        Err(GatewayError::Unavailable("not built yet".to_owned()))
    }
    async fn portability_export(&self, _ctx: &CallContext, _p: MemoryPortabilityExportParams) -> Result<MemoryPortabilityExportResult, GatewayError> {
        Err(GatewayError::Unavailable("not built yet".to_owned()))
    }
    async fn portability_import(&self, _ctx: &CallContext, _p: MemoryPortabilityImportParams) -> Result<MemoryPortabilityImportResult, GatewayError> {
        Err(GatewayError::Unavailable("not built yet".to_owned()))
    }
    async fn recall_stats(&self, _ctx: &CallContext, _p: MemoryRecallStatsParams) -> Result<MemoryRecallStatsResult, GatewayError> {
        Err(GatewayError::Unavailable("not built yet".to_owned()))
    }
    async fn recall_trace(&self, _ctx: &CallContext, _p: MemoryRecallTraceParams) -> Result<MemoryRecallTraceResult, GatewayError> {
        Err(GatewayError::Unavailable("not built yet".to_owned()))
    }
    async fn search(&self, _ctx: &CallContext, _p: MemorySearchParams) -> Result<MemorySearchResult, GatewayError> {
        Err(GatewayError::Unavailable("not built yet".to_owned()))
    }
    async fn search_files(&self, _ctx: &CallContext, _p: MemorySearchFilesParams) -> Result<MemorySearchFilesResult, GatewayError> {
        Err(GatewayError::Unavailable("not built yet".to_owned()))
    }
    async fn stats(&self, _ctx: &CallContext, _p: MemoryStatsParams) -> Result<MemoryStatsResult, GatewayError> {
        Err(GatewayError::Unavailable("not built yet".to_owned()))
    }
    async fn store(&self, _ctx: &CallContext, _p: MemoryStoreParams) -> Result<MemoryStoreResult, GatewayError> {
        Err(GatewayError::Unavailable("not built yet".to_owned()))
    }
    async fn unpin(&self, _ctx: &CallContext, _p: MemoryUnpinParams) -> Result<MemoryUnpinResult, GatewayError> {
        Err(GatewayError::Unavailable("not built yet".to_owned()))
    }
}
