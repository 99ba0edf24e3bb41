//! `system.*`.

use super::Rpc;
use crate::api::error::GatewayError;
use crate::api::generated::handlers::SystemApi;
use crate::api::generated::types::{SystemPingParams, SystemPingResult};
use crate::api::CallContext;

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
