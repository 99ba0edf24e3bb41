//! `GET /metrics`: the process's Prometheus exposition (text format 0.0.4). A plain route,
//! not part of the OpenAPI document, under the global rate limit like any other; it needs a
//! bearer token with scope `metrics`, `admin` or `*` (401 without a valid token, 403 without
//! the scope, in the REST error body).

use poem::{handler, Request, Response};

use crate::api::generated::methods::Scope;
use crate::obs::metrics::{render, CONTENT_TYPE};

/// The scopes that may read the metrics.
pub const SCOPES: &[Scope] = &[Scope::Metrics, Scope::Admin, Scope::All];

#[handler]
pub fn scrape(req: &Request) -> Response {
    if let Err(refused) = crate::http::security::bearer(req, SCOPES) {
        return refused.into_response();
    }
    Response::builder()
        .content_type(CONTENT_TYPE)
        .header(http::header::CACHE_CONTROL, "no-store")
        .body(render())
}
