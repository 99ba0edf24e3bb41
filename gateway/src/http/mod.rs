//! The HTTP surface: one poem route tree for every path, wrapped in the global rate limit.

pub mod health;
pub mod limits;

use std::sync::Arc;
use std::time::Instant;

use poem::{get, post, Endpoint, EndpointExt, IntoResponse, Request, Response, Route};
use serde_json::json;

use crate::state::AppState;

/// A JSON error body `{error: <message>}` with a status.
pub fn json_error(status: http::StatusCode, message: &str) -> Response {
    poem::web::Json(json!({"error": message}))
        .with_status(status)
        .into_response()
}

/// Builds the endpoint of one server generation.
pub fn app(state: Arc<AppState>) -> impl Endpoint<Output = Response> {
    let limiter_state = state.clone();
    Route::new()
        .at("/health", get(health::health))
        .at("/ws", get(crate::rpc::ws::upgrade))
        .at("/rpc", post(crate::rpc::http::handle))
        .data(state)
        .around(move |ep, req: Request| {
            let state = limiter_state.clone();
            async move {
                if !limits::RATE_EXEMPT.contains(&req.uri().path()) {
                    let ip = req
                        .remote_addr()
                        .as_socket_addr()
                        .map(|a| a.ip())
                        .unwrap_or(std::net::IpAddr::from([0, 0, 0, 0]));
                    if let Err(l) = state.http_limiter.check(ip, Instant::now()) {
                        let mut resp =
                            json_error(http::StatusCode::TOO_MANY_REQUESTS, "Too many requests");
                        let secs = l.retry_after.as_secs().max(1).to_string();
                        if let Ok(v) = http::HeaderValue::from_str(&secs) {
                            resp.headers_mut().insert(http::header::RETRY_AFTER, v);
                        }
                        return Ok(resp);
                    }
                }
                Ok(ep.call(req).await?.into_response())
            }
        })
}
