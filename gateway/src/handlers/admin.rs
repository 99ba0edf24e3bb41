//! `admin.approval.*`: the operator's decisions on tool calls waiting for approval
//! (`autonomy.approvals`, `docs/orchestration.md`).

use crate::api::error::GatewayError;
use crate::api::generated::handlers::AdminApi;
use crate::api::generated::types::{
    AdminApprovalClearDenialCacheParams, AdminApprovalClearDenialCacheResult,
    AdminApprovalPendingParams, AdminApprovalPendingResult, AdminApprovalRequest,
    AdminApprovalResolveAllParams, AdminApprovalResolveAllResult, AdminApprovalResolveParams,
    AdminApprovalResolveResult,
};
use crate::api::CallContext;

use super::Rpc;

impl AdminApi for Rpc {
    async fn approval_clear_denial_cache(
        &self,
        _ctx: &CallContext,
        _p: AdminApprovalClearDenialCacheParams,
    ) -> Result<AdminApprovalClearDenialCacheResult, GatewayError> {
        self.engine().approvals.clear_denials(None).await?;
        Ok(AdminApprovalClearDenialCacheResult { cleared: true })
    }

    async fn approval_pending(
        &self,
        _ctx: &CallContext,
        _p: AdminApprovalPendingParams,
    ) -> Result<AdminApprovalPendingResult, GatewayError> {
        let requests: Vec<_> = self
            .engine()
            .approvals
            .pending(None)
            .await?
            .into_iter()
            .map(|r| AdminApprovalRequest {
                id: r.id,
                session_key: r.session_key,
                agent_id: r.agent_id,
                tool_name: r.tool_name,
                summary: r.summary,
                created_at: r.created_at,
                expires_at: r.expires_at,
            })
            .collect();
        Ok(AdminApprovalPendingResult {
            total: requests.len() as i64,
            requests,
        })
    }

    async fn approval_resolve(
        &self,
        ctx: &CallContext,
        p: AdminApprovalResolveParams,
    ) -> Result<AdminApprovalResolveResult, GatewayError> {
        let by = ctx.client_id.as_str();
        self.engine()
            .approvals
            .resolve(&p.id, p.approved, by, p.reason.as_deref())
            .await?
            .ok_or_else(|| GatewayError::not_found("Approval request", &p.id))?;
        Ok(AdminApprovalResolveResult {
            id: p.id,
            approved: p.approved,
            approved_by: by.to_owned(),
            reason: p.reason,
        })
    }

    async fn approval_resolve_all(
        &self,
        _ctx: &CallContext,
        p: AdminApprovalResolveAllParams,
    ) -> Result<AdminApprovalResolveAllResult, GatewayError> {
        let approvals = &self.engine().approvals;
        let mut request_ids = Vec::new();
        for r in approvals.pending(p.session_key.as_deref()).await? {
            let done = approvals
                .resolve(&r.id, p.approved, &p.approved_by, p.reason.as_deref())
                .await?;
            if done.is_some() {
                request_ids.push(r.id);
            }
        }
        Ok(AdminApprovalResolveAllResult {
            resolved: request_ids.len() as i64,
            request_ids,
        })
    }
}
