//! `daemon.*`: run-time controls of the process that are not configuration.

use super::Rpc;
use crate::api::error::GatewayError;
use crate::api::generated::handlers::DaemonApi;
use crate::api::generated::types::{
    DaemonSetLogLevelParams, DaemonSetLogLevelParamsLevel as In, DaemonSetLogLevelResult,
    DaemonSetLogLevelResultLevel as Out, DaemonSetLogLevelResultScope,
};
use crate::api::CallContext;

impl DaemonApi for Rpc {
    async fn set_log_level(
        &self,
        ctx: &CallContext,
        params: DaemonSetLogLevelParams,
    ) -> Result<DaemonSetLogLevelResult, GatewayError> {
        // tracing has no fatal level: it is error.
        let filter = match params.level {
            In::Fatal | In::Error => "error",
            In::Warn => "warn",
            In::Info => "info",
            In::Debug => "debug",
            In::Trace => "trace",
        };
        let level = match params.level {
            In::Fatal => Out::Fatal,
            In::Error => Out::Error,
            In::Warn => Out::Warn,
            In::Info => Out::Info,
            In::Debug => Out::Debug,
            In::Trace => Out::Trace,
        };
        let directives = crate::logging::set_level(params.module.as_deref(), filter)
            .map_err(GatewayError::Unavailable)?;
        tracing::warn!(client = %ctx.principal.client_id, %directives, "log level changed");
        Ok(DaemonSetLogLevelResult {
            updated: true,
            level,
            scope: if params.module.is_some() {
                DaemonSetLogLevelResultScope::Module
            } else {
                DaemonSetLogLevelResultScope::Global
            },
            module: params.module,
            persistent: false,
        })
    }
}
