//! `system.*`.

use super::Rpc;
use crate::error::GatewayError;
use crate::rpc::generated::handlers::SystemApi;
use crate::rpc::generated::types::{SystemPingParams, SystemPingResult};
use crate::rpc::CallContext;

impl SystemApi for Rpc {
    async fn ping(
        &self,
        _ctx: &CallContext,
        _params: SystemPingParams,
    ) -> Result<SystemPingResult, GatewayError> {
        Ok(SystemPingResult {
            pong: true,
            ts: chrono::Utc::now().timestamp_millis(),
        })
    }
}
