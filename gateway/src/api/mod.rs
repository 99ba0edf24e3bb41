//! The ground floor: what every layer speaks and no transport knows. The generated method
//! surface (types, method table, handler traits, dispatch) and its runtime, the call context,
//! the JSON-RPC error object, the principal, the domain error, tenancy and scopes. It imports
//! nothing of the crate but the clock.

pub mod error;
pub mod generated;
pub mod invoke;
pub mod principal;
pub mod scopes;
pub mod tenancy;

use serde_json::{json, Value};

use generated::methods::{error_codes, Scope};

/// Who is calling, as established by authentication, and over which connection. Reads as
/// the principal's [`Identity`](crate::api::principal::Identity) (`ctx.client_id`, `ctx.scopes`,
/// `ctx.tenant()`).
#[derive(Debug, Clone)]
pub struct CallContext {
    pub principal: crate::api::principal::Principal,
    /// The WebSocket connection, when the call came over /ws.
    pub connection: Option<u64>,
}

impl std::ops::Deref for CallContext {
    type Target = crate::api::principal::Identity;

    fn deref(&self) -> &crate::api::principal::Identity {
        &self.principal
    }
}

/// A JSON-RPC error object.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
}

impl RpcError {
    pub fn new(code: i64, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
    pub fn parse_error() -> Self {
        Self::new(error_codes::PARSE_ERROR, "Parse error")
    }
    pub fn invalid_request(detail: &str) -> Self {
        Self::new(
            error_codes::INVALID_REQUEST,
            format!("Invalid Request: {detail}"),
        )
    }
    pub fn method_not_found(method: &str) -> Self {
        // The method name is echoed only when it is short and printable.
        let shown: String = method
            .chars()
            .take(128)
            .filter(|c| !c.is_control())
            .collect();
        Self::new(
            error_codes::METHOD_NOT_FOUND,
            format!("Method not found: {shown}"),
        )
    }
    pub fn invalid_params(detail: impl std::fmt::Display) -> Self {
        Self::new(
            error_codes::INVALID_PARAMS,
            format!("Invalid params: {detail}"),
        )
    }
    pub fn insufficient_scope(scope: Scope) -> Self {
        Self::new(
            error_codes::INTERNAL_ERROR,
            format!("Insufficient scope: requires '{}'", scope.as_str()),
        )
    }
    pub fn internal() -> Self {
        Self::new(error_codes::INTERNAL_ERROR, "Internal error")
    }
    pub fn rate_limited() -> Self {
        Self::new(error_codes::RATE_LIMITED, "Rate limit exceeded")
    }
    pub fn not_implemented(method: &str) -> Self {
        Self::new(
            error_codes::NOT_IMPLEMENTED,
            format!("Not implemented: {method}"),
        )
    }

    /// The full response object for this error.
    pub fn response(&self, id: Value) -> Value {
        json!({"jsonrpc": "2.0", "error": {"code": self.code, "message": self.message}, "id": id})
    }
}
