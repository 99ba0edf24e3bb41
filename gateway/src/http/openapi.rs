//! The typed HTTP API as one poem-openapi service: `/health`, the REST API and `/v1`. The
//! same service produces the OpenAPI document (`/openapi.json`, `agent-gateway openapi`, the
//! snapshot in `generated/openapi/`) and the offline Swagger UI at `/docs`.

use poem_openapi::payload::Json;
use poem_openapi::{ExternalDocumentObject, OpenApi, OpenApiService, Tags};

use crate::http::api::types::Health;
use crate::http::api::RestApi;
use crate::http::media::MediaApi;
use crate::http::v1::V1Api;

#[derive(Tags)]
enum CoreTag {
    /// Liveness.
    Core,
}

pub struct CoreApi;

#[OpenApi]
impl CoreApi {
    /// Health
    ///
    /// No token needed; exempt from the rate limit.
    #[oai(
        path = "/health",
        method = "get",
        tag = "CoreTag::Core",
        operation_id = "health"
    )]
    async fn health(&self) -> Json<Health> {
        Json(Health::now())
    }
}

pub type Apis = (CoreApi, RestApi, V1Api, MediaApi);

const DESCRIPTION: &str = "One authenticated front door for a fleet of AI agents. \
`/v1` is OpenAI-compatible (point an OpenAI SDK's base URL at it); `/api` is the REST API \
with server-sent event streams; `/media` serves files agents saved. Every route except `/health` and `/api/health` needs \
`Authorization: Bearer <token>` (the SSE routes also take `?token=`).\n\n\
JSON-RPC (`/ws`, `/rpc`): [every method, its scope, params, result and errors](/docs/rpc/), \
and the OpenRPC document [/openrpc.json](/openrpc.json).";

/// The service (routes and document).
pub fn service() -> OpenApiService<Apis, ()> {
    OpenApiService::new(
        (CoreApi, RestApi, V1Api, MediaApi),
        "agent-gateway",
        env!("CARGO_PKG_VERSION"),
    )
    .description(DESCRIPTION)
    .external_document(
        ExternalDocumentObject::new("/docs/rpc/")
            .description("JSON-RPC methods (/ws, /rpc): scopes, params, results, errors"),
    )
}

/// The OpenAPI document as pretty JSON with a trailing newline (what the snapshot holds).
pub fn document() -> String {
    let mut s = service().spec();
    if !s.ends_with('\n') {
        s.push('\n');
    }
    s
}
