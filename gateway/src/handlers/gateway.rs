//! `gateway.*`: process status and the in-process restart.

use super::Rpc;
use crate::api::error::GatewayError;
use crate::api::generated::handlers::GatewayApi;
use crate::api::generated::types::{
    GatewayRestartParams, GatewayRestartResult, GatewayStatusParams, GatewayStatusResult,
};
use crate::api::CallContext;
use crate::config;

/// Resident set size in bytes, from /proc (0 where unavailable).
fn rss_bytes() -> i64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<i64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

impl GatewayApi for Rpc {
    async fn restart(
        &self,
        ctx: &CallContext,
        _params: GatewayRestartParams,
    ) -> Result<GatewayRestartResult, GatewayError> {
        tracing::info!(client = %ctx.client_id, "restart requested");
        let control = self.state.control.clone();
        // The answer goes out first; the server loop then closes this generation.
        #[allow(
            clippy::disallowed_methods,
            reason = "the restart request outlives this call by design; the server loop owns what follows"
        )]
        tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            control.restart_requested.notify_one();
        });
        Ok(GatewayRestartResult {
            restarting: true,
            generation: self.state.generation as i64 + 1,
        })
    }

    async fn status(
        &self,
        _ctx: &CallContext,
        _params: GatewayStatusParams,
    ) -> Result<GatewayStatusResult, GatewayError> {
        let s = &self.state;
        Ok(GatewayStatusResult {
            pid: i64::from(std::process::id()),
            uptime: s.uptime(),
            memory_usage: rss_bytes(),
            node_version: format!("agent-gateway/{}", env!("CARGO_PKG_VERSION")),
            config_paths: s
                .config_paths
                .iter()
                .map(|p| p.display().to_string())
                .collect(),
            sections: config::sections(),
            generation: s.generation as i64,
            connections: s.hub().count() as i64,
        })
    }
}
