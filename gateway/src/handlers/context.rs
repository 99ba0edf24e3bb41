//! `context.*`: the stored conversations and the summary tree of each.

use super::Rpc;
use crate::error::GatewayError;
use crate::rpc::generated::handlers::ContextApi;
use crate::rpc::generated::types::*;
use crate::rpc::CallContext;

impl ContextApi for Rpc {
    async fn conversations(&self, _ctx: &CallContext, _p: ContextConversationsParams) -> Result<ContextConversationsResult, GatewayError> {
        Err(GatewayError::Unavailable("not built yet".to_owned()))
    }
    async fn tree(&self, _ctx: &CallContext, _p: ContextTreeParams) -> Result<ContextTreeResult, GatewayError> {
        Err(GatewayError::Unavailable("not built yet".to_owned()))
    }
}
