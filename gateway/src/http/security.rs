//! Who may call the REST and `/v1` routes, as poem-openapi security schemes (so the OpenAPI
//! document declares them): a bearer token, or for the SSE routes also `?token=`. The
//! checkers verify the token against the token store and the scope the area requires:
//! `/v1` takes `rpc` or `api`, `/api` takes `rpc` (`admin` includes `rpc`). A token with
//! neither (e.g. an `mcp-client` token) gets 403.

use std::sync::Arc;

use poem::{Request, RequestBody};
use poem_openapi::auth::{ApiKey, Bearer};
use poem_openapi::registry::Registry;
use poem_openapi::{ApiExtractor, ApiExtractorType, ExtractParamOptions, SecurityScheme};

use crate::api::generated::methods::Scope;
use crate::api::principal::Principal;
use crate::app::state::AppState;
use crate::transport::problem::{Area, Problem};

fn area_error(req: &Request, p: Problem) -> poem::Error {
    let resp = p.into_area_response(Area::of(req.uri().path()));
    poem::Error::from_response(resp)
}

fn check(req: &Request, presented: &str, accepted: &[Scope]) -> poem::Result<Principal> {
    let Some(state) = req.data::<Arc<AppState>>() else {
        return Err(area_error(req, Problem::internal()));
    };
    let principal = match req.extensions().get::<crate::auth::Verified>() {
        Some(v) => v.0.clone(),
        None => match state.tokens.verify(presented) {
            Some(p) => p,
            None => return Err(area_error(req, Problem::unauthorized())),
        },
    };
    let allowed = accepted.iter().any(|s| principal.allows(*s));
    if !allowed {
        let names: Vec<&str> = accepted.iter().map(|s| s.as_str()).collect();
        return Err(area_error(
            req,
            Problem::forbidden(format!(
                "Insufficient scope: requires '{}'",
                names.join("' or '")
            )),
        ));
    }
    Ok(principal)
}

/// A plain route's bearer token (`Authorization: Bearer`, never `?token=`) holding one of
/// `accepted`, through the same checks as the typed routes: 401 without a valid token, 403
/// without the scope, in the area's error body.
pub fn bearer(req: &Request, accepted: &[Scope]) -> poem::Result<Principal> {
    let Some(token) = crate::auth::presented_token(req, false) else {
        return Err(area_error(req, Problem::unauthorized()));
    };
    check(req, &token, accepted)
}

async fn check_v1(req: &Request, bearer: Bearer) -> poem::Result<Principal> {
    check(req, &bearer.token, &[Scope::Rpc, Scope::Api])
}

async fn check_rest(req: &Request, bearer: Bearer) -> poem::Result<Principal> {
    check(req, &bearer.token, &[Scope::Rpc])
}

async fn check_rest_query(req: &Request, key: ApiKey) -> poem::Result<Principal> {
    check(req, &key.key, &[Scope::Rpc])
}

/// `Authorization: Bearer <token>`; the token needs scope `rpc` or `api`.
#[derive(SecurityScheme)]
#[oai(ty = "bearer", checker = "check_v1", rename = "CompatibleBearer")]
pub struct V1Auth(pub Principal);

/// `Authorization: Bearer <token>`; the token needs scope `rpc`.
#[derive(SecurityScheme)]
#[oai(ty = "bearer", checker = "check_rest", rename = "Bearer")]
pub struct RestBearer(pub Principal);

/// `?token=<token>` for clients that cannot set headers (EventSource); scope `rpc`.
#[derive(SecurityScheme)]
#[oai(
    ty = "api_key",
    key_name = "token",
    key_in = "query",
    checker = "check_rest_query",
    rename = "QueryToken"
)]
pub struct RestQuery(pub Principal);

/// The SSE routes accept either (the header wins when both are present). Written by hand
/// rather than derived, so that a valid token without the scope is a 403 whichever way it
/// came, and only a missing or unknown token is a 401.
pub struct SseAuth(pub Principal);

impl SseAuth {
    pub fn principal(&self) -> &Principal {
        &self.0
    }
}

impl<'a> ApiExtractor<'a> for SseAuth {
    const TYPES: &'static [ApiExtractorType] = &[ApiExtractorType::SecurityScheme];
    type ParamType = ();
    type ParamRawType = ();

    fn register(registry: &mut Registry) {
        <RestBearer as ApiExtractor>::register(registry);
        <RestQuery as ApiExtractor>::register(registry);
    }

    fn security_schemes() -> Vec<&'static str> {
        vec!["Bearer", "QueryToken"]
    }

    async fn from_request(
        req: &'a Request,
        _body: &mut RequestBody,
        _opts: ExtractParamOptions<Self::ParamType>,
    ) -> poem::Result<Self> {
        let Some(token) = crate::auth::presented_token(req, true) else {
            return Err(area_error(req, Problem::unauthorized()));
        };
        check(req, &token, &[Scope::Rpc]).map(Self)
    }
}
