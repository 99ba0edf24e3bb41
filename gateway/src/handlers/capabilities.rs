//! `capabilities.introspect` over `/rpc` and `/ws`: the caller is a client token, so the answer
//! is its scopes (capability enforcement applies to runs, which read their own answer through
//! their `my_capabilities` tool).

use crate::api::error::GatewayError;
use crate::api::generated::handlers::CapabilitiesApi;
use crate::api::generated::types::{
    CapabilitiesIntrospectParams, CapabilitiesIntrospectResult, CapabilitiesIntrospectResultKind,
};
use crate::api::CallContext;

use super::Rpc;

impl CapabilitiesApi for Rpc {
    async fn introspect(
        &self,
        ctx: &CallContext,
        _p: CapabilitiesIntrospectParams,
    ) -> Result<CapabilitiesIntrospectResult, GatewayError> {
        Ok(CapabilitiesIntrospectResult {
            kind: CapabilitiesIntrospectResultKind::Client,
            agent_id: None,
            scopes: ctx.scopes.iter().map(|s| s.as_str().to_owned()).collect(),
            enabled: false,
            caps: Vec::new(),
            budget: None,
            outward_quota: None,
        })
    }
}
