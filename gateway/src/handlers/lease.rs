//! `lease.revoke`: the cooperative stop - a run whose lease is revoked stops at its next gate
//! decision (`docs/orchestration.md`).

use crate::api::error::GatewayError;
use crate::api::generated::handlers::LeaseApi;
use crate::api::generated::types::{LeaseRevokeParams, LeaseRevokeResult};
use crate::api::CallContext;

use super::Rpc;

impl LeaseApi for Rpc {
    async fn revoke(
        &self,
        _ctx: &CallContext,
        p: LeaseRevokeParams,
    ) -> Result<LeaseRevokeResult, GatewayError> {
        let tree = self.engine().runs.tree();
        let runs = match (&p.lease_id, &p.root_run_id) {
            (Some(lease), None) => tree
                .all()
                .into_iter()
                .filter(|r| r.lease.id == *lease)
                .collect(),
            (None, Some(root)) => tree.tree(root),
            _ => {
                return Err(GatewayError::InvalidParams(
                    "exactly one of 'leaseId' and 'rootRunId' is required".into(),
                ))
            }
        };
        let revoked = runs.iter().filter(|r| r.lease.revoke()).count();
        Ok(LeaseRevokeResult {
            revoked: revoked as i64,
        })
    }
}
