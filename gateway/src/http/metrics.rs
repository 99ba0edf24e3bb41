//! `GET /metrics`: the process's Prometheus exposition (text format 0.0.4). A plain route,
//! not part of the OpenAPI document, under the global rate limit like any other; it needs a
//! bearer token with scope `metrics`, `admin` or `*` (401 without a valid token, 403 without
//! the scope, in the REST error body).

use poem::{handler, Request, Response};

use crate::api::generated::methods::Scope;
use crate::http::under;
use crate::metrics::{render, HttpRoute, CONTENT_TYPE, R};

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

/// The route template of a request path; `hooks` is the webhook base path when webhooks
/// are on. Never allocates.
pub fn http_route(path: &str, hooks: Option<&str>) -> HttpRoute {
    HttpRoute(template(path, hooks))
}

fn template(path: &str, hooks: Option<&str>) -> R {
    match path {
        "/v1/chat/completions" => return R::V1Chat,
        "/v1/models" => return R::V1Models,
        "/v1/embeddings" => return R::V1Embeddings,
        "/v1/responses" => return R::V1Responses,
        "/rpc" => return R::Rpc,
        "/ws" => return R::Ws,
        "/health" => return R::Health,
        "/metrics" => return R::Metrics,
        "/" => return R::Root,
        "/openapi.json" => return R::OpenApi,
        "/openrpc.json" => return R::OpenRpc,
        "/api/health" => return R::ApiHealth,
        "/api/agents" => return R::ApiAgents,
        "/api/channels" => return R::ApiChannels,
        "/api/activity" => return R::ApiActivity,
        "/api/memory/search" => return R::ApiMemorySearch,
        "/api/memory/stats" => return R::ApiMemoryStats,
        "/api/chat/history" => return R::ApiChatHistory,
        "/api/chat" => return R::ApiChat,
        "/api/chat/stream" => return R::ApiChatStream,
        "/api/events" => return R::ApiEvents,
        _ => {}
    }
    if let Some(rest) = path.strip_prefix("/v1/models/") {
        // `/v1/models/<id>` and `/v1/models/<provider>/<model>`.
        let mut segments = rest.split('/');
        let ok = segments.clone().count() <= 2 && segments.all(|s| !s.is_empty());
        return if ok { R::V1Model } else { R::Other };
    }
    if let Some(rest) = path.strip_prefix("/media/") {
        return match rest.split_once('/') {
            None if !rest.is_empty() => R::Media,
            Some((id, "meta")) if !id.is_empty() => R::MediaMeta,
            _ => R::Other,
        };
    }
    if let Some(rest) = hooks.and_then(|base| under(path, base)) {
        let rest = rest.trim_matches('/');
        return if rest.eq_ignore_ascii_case(crate::http::webhooks::STRICT_PATH) {
            R::HookStrict
        } else {
            R::HookMapped
        };
    }
    if under(path, crate::http::docs::RPC_DOCS_PATH).is_some() {
        R::RpcDocs
    } else if under(path, "/docs").is_some() {
        R::Docs
    } else if under(path, "/app").is_some() {
        R::App
    } else {
        R::Other
    }
}
