//! POST /rpc: JSON-RPC over HTTP with a bearer token.

use std::sync::Arc;

use poem::web::Data;
use poem::{IntoResponse, Request, Response};
use serde_json::Value;

use super::envelope::{handle_text, Reply};
use super::RpcError;
use crate::http::json_error;
use crate::http::limits::{read_gateway_body, BodyError};
use crate::state::AppState;

fn rpc_body(status: http::StatusCode, v: Value) -> Response {
    poem::web::Json(v).with_status(status).into_response()
}

#[poem::handler]
pub async fn handle(
    req: &Request,
    body: poem::Body,
    Data(state): Data<&Arc<AppState>>,
) -> Response {
    let Some(principal) = state.tokens.authenticate(req, false).cloned() else {
        let mut r = json_error(http::StatusCode::UNAUTHORIZED, "Unauthorized");
        r.headers_mut().insert(
            http::header::WWW_AUTHENTICATE,
            http::HeaderValue::from_static("Bearer"),
        );
        return r;
    };
    let g = &state.config.gateway;
    let body = match read_gateway_body(req, body, g).await {
        Ok(b) => b,
        Err(BodyError::TooLarge) => {
            return rpc_body(
                http::StatusCode::PAYLOAD_TOO_LARGE,
                RpcError::invalid_request(&format!(
                    "body exceeds httpBodyLimitBytes ({})",
                    g.http_body_limit_bytes
                ))
                .response(Value::Null),
            )
        }
        Err(BodyError::Timeout) => {
            return json_error(
                http::StatusCode::REQUEST_TIMEOUT,
                "Request body not received in time",
            )
        }
        Err(BodyError::Io) => {
            return json_error(
                http::StatusCode::BAD_REQUEST,
                "Request body could not be read",
            )
        }
    };
    let Ok(text) = std::str::from_utf8(&body) else {
        return rpc_body(
            http::StatusCode::OK,
            RpcError::parse_error().response(Value::Null),
        );
    };
    let ctx = principal.context(None);
    let rpc = crate::handlers::Rpc::new(state.clone());
    match handle_text(&rpc, &ctx, text, g.max_batch_size).await {
        Reply::Some(v) => rpc_body(http::StatusCode::OK, v),
        Reply::None => http::StatusCode::NO_CONTENT.into_response(),
    }
}
