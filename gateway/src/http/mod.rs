//! The HTTP surface: one poem route tree for every path, wrapped in the global rate limit;
//! the typed API (health, REST, /v1) comes from poem-openapi with its document and UI.

pub mod api;
pub mod docs;
pub mod either;
pub mod media;
pub mod metrics;
pub mod openapi;
/// Body limits and error bodies, shared with the JSON-RPC routes (`crate::transport`).
use crate::transport::{limits, problem, too_many_requests};
pub mod security;
pub mod sse;
pub mod strict_json;
pub mod turns;
pub mod v1;
pub mod webhooks;

use std::sync::Arc;
use std::time::Instant;

use poem::endpoint::StaticFilesEndpoint;
use poem::web::Redirect;
use poem::{get, handler, post, Endpoint, EndpointExt, IntoResponse, Request, Response, Route};

use crate::app::state::AppState;
use limits::{read_gateway_body, BodyError};
use problem::{Area, Problem};

#[handler]
fn to_dashboard() -> Redirect {
    Redirect::temporary("/app/")
}

/// Reads a typed route's POST body under `gateway.httpBodyLimitBytes` (counted as it
/// arrives, chunked too) before poem-openapi parses it; a refusal is the area's error answer.
async fn buffer_body(state: &AppState, req: &mut Request) -> Result<(), Response> {
    let g = &state.config.gateway;
    let body = req.take_body();
    let refusal = match read_gateway_body(req, body, g).await {
        Ok(bytes) => {
            req.set_body(bytes);
            return Ok(());
        }
        Err(BodyError::TooLarge) => Problem::new(
            http::StatusCode::PAYLOAD_TOO_LARGE,
            format!("Request body exceeds {} bytes", g.http_body_limit_bytes),
        ),
        Err(BodyError::Timeout) => Problem::new(
            http::StatusCode::REQUEST_TIMEOUT,
            "Request body not received in time",
        ),
        Err(BodyError::Io) => Problem::bad_request("Request body could not be read"),
    };
    Err(refusal.into_area_response(Area::of(req.uri().path())))
}

/// Whether `path` is `prefix` or below it (whole segments): what follows, if so.
pub fn under<'a>(path: &'a str, prefix: &str) -> Option<&'a str> {
    path.strip_prefix(prefix)
        .filter(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// The paths poem-openapi serves: `/health` itself and everything under each prefix. The
/// route tree is mounted from this list and [`front`] reads the POST bodies of exactly these
/// paths, so the two cannot disagree.
struct TypedPaths {
    prefixes: Vec<&'static str>,
}

impl TypedPaths {
    const EXACT: &'static str = "/health";

    fn new(web_enabled: bool) -> Self {
        let mut prefixes = vec!["/v1", "/media"];
        // The REST API exists only while `gateway.web.enabled`; elsewhere /api/* is a plain 404.
        if web_enabled {
            prefixes.push("/api");
        }
        Self { prefixes }
    }

    fn contains(&self, path: &str) -> bool {
        path == Self::EXACT
            || self
                .prefixes
                .iter()
                .any(|prefix| under(path, prefix).is_some())
    }
}

/// Everything every request goes through, in one layer: the rate limit, the typed routes'
/// body reading, framework errors turned into the area's error body, and `nosniff`.
async fn front<E: Endpoint>(
    ep: Arc<E>,
    state: Arc<AppState>,
    typed: Arc<TypedPaths>,
    mut req: Request,
) -> poem::Result<Response> {
    let area = Area::of(req.uri().path());
    if !limits::RATE_EXEMPT.contains(&req.uri().path()) {
        let peer = req
            .remote_addr()
            .as_socket_addr()
            .map(|a| a.ip())
            .unwrap_or(std::net::IpAddr::from([0, 0, 0, 0]));
        let key = state.http_limiter.key(peer, req.headers());
        if let Err(l) = state.http_limiter.check(key) {
            crate::metrics::rate_limited(crate::metrics::Limiter::Http);
            return Ok(too_many_requests(area, &l));
        }
        // /rpc counts the rest of a batch under the same key (other paths skip the extension's
        // allocation).
        if req.uri().path() == "/rpc" {
            req.extensions_mut().insert(limits::RateKey(key));
        }
    }
    let mut resp = if req.method() == http::Method::POST && typed.contains(req.uri().path()) {
        // Every typed POST route takes a bearer token: without a valid one the endpoint's 401
        // goes out before a byte of the body is read (and the connection is not reused).
        let verified = if limits::RATE_EXEMPT.contains(&req.uri().path()) {
            None
        } else {
            match state.tokens.authenticate(&req, false) {
                Some(p) => Some(p),
                None => {
                    let mut resp = Problem::unauthorized().into_area_response(area);
                    resp.headers_mut().insert(
                        http::header::CONNECTION,
                        http::HeaderValue::from_static("close"),
                    );
                    return Ok(resp);
                }
            }
        };
        // The route's security scheme takes this principal instead of hashing the token again.
        if let Some(p) = verified {
            req.extensions_mut().insert(crate::auth::Verified(p));
        }
        match buffer_body(&state, &mut req).await {
            Ok(()) => answer(&*ep, req, area).await,
            Err(refused) => refused,
        }
    } else {
        answer(&*ep, req, area).await
    };
    // No browser guesses a type the gateway did not declare (media files above all).
    resp.headers_mut().insert(
        http::header::X_CONTENT_TYPE_OPTIONS,
        http::HeaderValue::from_static("nosniff"),
    );
    Ok(resp)
}

/// [`front`], counted: `agentgw_http_requests_total` and the time to the response head, by
/// route template (never the raw path), method and status.
async fn measured<E: Endpoint>(
    ep: Arc<E>,
    state: Arc<AppState>,
    typed: Arc<TypedPaths>,
    req: Request,
) -> poem::Result<Response> {
    let started = Instant::now();
    let hooks = state.webhooks.as_deref().map(|h| h.base.as_str());
    let route = crate::http::metrics::http_route(req.uri().path(), hooks);
    let method = crate::metrics::http_method(req.method());
    let resp = front(ep, state, typed, req).await;
    let status = match &resp {
        Ok(r) => r.status(),
        Err(e) => e.status(),
    };
    crate::metrics::http_request(route, method, status.as_u16(), started.elapsed());
    resp
}

/// The endpoint's answer; a framework error becomes the area's error body.
async fn answer<E: Endpoint>(ep: &E, req: Request, area: Area) -> Response {
    match ep.call(req).await {
        Ok(r) => r.into_response(),
        Err(e) if problem::is_final(&e) => e.into_response(),
        Err(e) => Problem::from_poem(&e).into_area_response(area),
    }
}

/// Builds the endpoint of one server generation.
pub fn app(state: Arc<AppState>) -> impl Endpoint<Output = Response> {
    // The process's metrics recorder, before anything is counted.
    crate::metrics::install();
    let service = openapi::service();
    let docs = state.config.gateway.docs.enabled;
    let web = &state.config.gateway.web;
    let mut route = Route::new()
        .at("/ws", get(crate::rpc::ws::upgrade))
        .at("/rpc", post(crate::rpc::http::handle))
        .at("/metrics", get(metrics::scrape));
    if let Some(hooks) = &state.webhooks {
        route = route.nest(&hooks.base, post(crate::http::webhooks::hook));
    }
    if docs {
        route = route
            .at("/openapi.json", service.spec_endpoint())
            .nest("/docs", service.swagger_ui())
            .at("/openrpc.json", get(docs::openrpc))
            .nest(docs::RPC_DOCS_PATH, get(docs::rpc_pages));
    }
    if web.enabled {
        route = route.at("/", get(to_dashboard));
        if let Some(dir) = &web.dist_dir {
            route = route.nest(
                "/app",
                StaticFilesEndpoint::new(dir).index_file("index.html"),
            );
        }
    }
    // One instance of the typed API behind every path it serves (no wrapper of its own:
    // `front` reads its bodies and maps its errors).
    let typed = Arc::new(poem::IntoEndpoint::into_endpoint(service));
    let paths = Arc::new(TypedPaths::new(web.enabled));
    route = route.at(TypedPaths::EXACT, typed.clone());
    for prefix in &paths.prefixes {
        route = route.nest_no_strip(*prefix, typed.clone());
    }
    #[cfg(feature = "ws-echo")]
    let route = route.at(crate::rpc::ws_echo::PATH, get(crate::rpc::ws_echo::upgrade));
    let route = Arc::new(route.data(state.clone()));
    poem::endpoint::make(move |req: Request| {
        measured(route.clone(), state.clone(), paths.clone(), req)
    })
}

#[cfg(test)]
mod tests {
    use super::TypedPaths;

    #[test]
    fn typed_paths_are_whole_segments() {
        let on = TypedPaths::new(true);
        for p in [
            "/health",
            "/v1",
            "/v1/chat/completions",
            "/media/x",
            "/api",
            "/api/agents",
        ] {
            assert!(on.contains(p), "{p}");
        }
        for p in [
            "/healthz", "/v10", "/v1x/a", "/rpc", "/hooks/x", "/", "/apix",
        ] {
            assert!(!on.contains(p), "{p}");
        }
        let off = TypedPaths::new(false);
        assert!(!off.contains("/api/agents"));
        assert!(off.contains("/v1/models"));
    }
}
