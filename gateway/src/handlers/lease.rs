//! `lease.revoke`: the cooperative stop - a run whose lease is revoked stops at its next gate
//! decision, whichever node runs it (`docs/orchestration.md`).

use crate::api::error::GatewayError;
use crate::api::generated::handlers::LeaseApi;
use crate::api::generated::types::{LeaseRevokeParams, LeaseRevokeResult};
use crate::api::CallContext;
use crate::store::runs::StopScope;

use super::Rpc;

impl LeaseApi for Rpc {
    async fn revoke(
        &self,
        _ctx: &CallContext,
        p: LeaseRevokeParams,
    ) -> Result<LeaseRevokeResult, GatewayError> {
        let run_id;
        let scope = match (&p.lease_id, &p.root_run_id) {
            (Some(lease), None) => {
                // A lease is named after its run (`lease_<hex>` of `run_<hex>`).
                let Some(hex) = lease.strip_prefix("lease_") else {
                    return Ok(LeaseRevokeResult { revoked: 0 });
                };
                run_id = format!("run_{hex}");
                StopScope::Run(&run_id)
            }
            (None, Some(root)) => StopScope::Tree(root),
            _ => {
                return Err(GatewayError::InvalidParams(
                    "exactly one of 'leaseId' and 'rootRunId' is required".into(),
                ))
            }
        };
        let revoked = self.engine().runs.revoke(scope).await?;
        Ok(LeaseRevokeResult {
            revoked: revoked as i64,
        })
    }
}
