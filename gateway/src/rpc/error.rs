//! The JSON-RPC mapping of the domain error: the only place a [`GatewayError`] becomes an
//! error object on the wire (REST and `/v1` bodies are mapped in `transport/problem.rs`).

use crate::api::error::GatewayError;
use crate::api::generated::methods::error_codes;
use crate::api::RpcError;

impl From<GatewayError> for RpcError {
    fn from(e: GatewayError) -> Self {
        match e {
            GatewayError::InvalidParams(m) => {
                RpcError::new(error_codes::INVALID_PARAMS, format!("Invalid params: {m}"))
            }
            GatewayError::NotFound(m) => RpcError::new(error_codes::NOT_FOUND, m),
            GatewayError::Conflict(m) => RpcError::new(error_codes::CONFLICT, m),
            GatewayError::RateLimited(m) => RpcError::new(error_codes::RATE_LIMITED, m),
            GatewayError::Unavailable(m) | GatewayError::Busy(m) => {
                RpcError::new(error_codes::UNAVAILABLE, m)
            }
            GatewayError::Internal(detail) => {
                tracing::error!(error = %detail, "handler failed");
                RpcError::internal()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handler_failures_hide_their_details() {
        let e = RpcError::from(GatewayError::Internal("db at /secret/path failed".into()));
        assert_eq!(e, RpcError::new(-32603, "Internal error"));
        assert_eq!(
            RpcError::from(GatewayError::NotFound("no such agent".into())).code,
            -32001
        );
        assert_eq!(
            RpcError::from(GatewayError::Conflict("suspended".into())).code,
            -32002
        );
        assert_eq!(
            RpcError::from(GatewayError::Unavailable("no provider".into())).code,
            -32003
        );
        let p = RpcError::from(GatewayError::InvalidParams("'limit' too large".into()));
        assert_eq!(
            (p.code, p.message.as_str()),
            (-32602, "Invalid params: 'limit' too large")
        );
    }
}
