//! POST /rpc: JSON-RPC over HTTP with a bearer token.

use std::sync::Arc;

use poem::web::Data;
use poem::{IntoResponse, Request, Response};
use serde_json::Value;

use super::envelope::{handle_text, Reply};
use crate::api::RpcError;
use crate::app::state::AppState;
use crate::transport::limits::{read_gateway_body, BodyError, RateKey};
use crate::transport::problem::Area;
use crate::transport::{json_error, too_many_requests};

fn rpc_body(status: http::StatusCode, v: Value) -> Response {
    poem::web::Json(v).with_status(status).into_response()
}

#[poem::handler]
pub async fn handle(
    req: &Request,
    body: poem::Body,
    Data(state): Data<&Arc<AppState>>,
) -> Response {
    let Some(principal) = state.tokens.authenticate(req, false) else {
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
            let refusal = RpcError::invalid_request(&format!(
                "body exceeds httpBodyLimitBytes ({})",
                g.http_body_limit_bytes
            ));
            crate::metrics::rpc_refused(refusal.code);
            return rpc_body(
                http::StatusCode::PAYLOAD_TOO_LARGE,
                refusal.response(Value::Null),
            );
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
        let refusal = RpcError::parse_error();
        crate::metrics::rpc_refused(refusal.code);
        return rpc_body(http::StatusCode::OK, refusal.response(Value::Null));
    };
    // The request itself was counted by the front layer; a batch counts its other items.
    let items = batch_items(text, g.max_batch_size);
    if items > 1 {
        let key = match req.extensions().get::<RateKey>() {
            Some(k) => k.0,
            None => {
                let peer = req
                    .remote_addr()
                    .as_socket_addr()
                    .map(|a| a.ip())
                    .unwrap_or(std::net::IpAddr::from([0, 0, 0, 0]));
                state.http_limiter.key(peer, req.headers())
            }
        };
        if let Err(l) = state.http_limiter.check_n(key, items - 1) {
            crate::metrics::rate_limited(crate::metrics::Limiter::Http);
            return too_many_requests(Area::of(req.uri().path()), &l);
        }
    }
    let ctx = principal.context(None);
    let rpc = crate::handlers::Rpc::new(state.clone());
    match handle_text(&rpc, &ctx, text, g.max_batch_size).await {
        Reply::Some(v) => rpc_body(http::StatusCode::OK, v),
        Reply::None => http::StatusCode::NO_CONTENT.into_response(),
    }
}

/// How many calls a message counts for against the rate limits: the items of a batch that
/// will run (at most `max_batch`), else 1. A batch over `maxBatchSize`, an empty one or one that
/// does not parse is refused whole without running anything, so it counts as one message.
pub fn batch_items(text: &str, max_batch: usize) -> u32 {
    if !text.trim_start().starts_with('[') {
        return 1;
    }
    // Counting needs no values: IgnoredAny skips each item without building it.
    match serde_json::from_str::<Vec<serde::de::IgnoredAny>>(text) {
        Ok(items) if !items.is_empty() && items.len() <= max_batch => {
            u32::try_from(items.len()).unwrap_or(u32::MAX)
        }
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::batch_items;

    #[test]
    fn a_batch_counts_its_items_and_anything_else_counts_one() {
        let call = r#"{"jsonrpc":"2.0","id":1,"method":"system.ping"}"#;
        assert_eq!(batch_items(call, 50), 1);
        assert_eq!(batch_items(&format!(" \n[{call},{call},{call}]"), 50), 3);
        assert_eq!(
            batch_items(&format!("[{call},{call},{call}]"), 3),
            3,
            "at maxBatchSize"
        );
        assert_eq!(
            batch_items(&format!("[{call},{call},{call}]"), 2),
            1,
            "past it: refused whole"
        );
        assert_eq!(batch_items("[]", 50), 1);
        assert_eq!(batch_items("[1, 2", 50), 1);
        assert_eq!(batch_items("[1, {\"a\": [2, 3]}]", 50), 2);
    }
}
