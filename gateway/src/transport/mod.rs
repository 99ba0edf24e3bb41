//! What every HTTP-facing route shares, whatever serves it (the REST/`/v1` tree in `http`, the
//! JSON-RPC routes in `rpc`): body limits, the rate limiter, and error bodies. It depends on
//! neither of them, so they do not depend on each other.

pub mod limits;
pub mod problem;
pub mod watch;

use poem::Response;

use problem::{Area, Problem};

/// A JSON error body `{error: <message>}` with a status (for the routes outside the typed
/// API: `/rpc`, `/ws`).
pub fn json_error(status: http::StatusCode, message: &str) -> Response {
    Problem::new(status, message).into_area_response(Area::Rest)
}

/// The rate limit's refusal: 429 with `Retry-After` (whole seconds, at least 1) and the
/// area's error body.
pub fn too_many_requests(area: Area, limited: &limits::Limited) -> Response {
    let mut resp = Problem::new(http::StatusCode::TOO_MANY_REQUESTS, "Too many requests")
        .into_area_response(area);
    let secs = limited.retry_after.as_secs_f64().ceil().max(1.0) as u64;
    resp.headers_mut()
        .insert(http::header::RETRY_AFTER, http::HeaderValue::from(secs));
    resp
}
