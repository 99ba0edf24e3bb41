//! Error bodies of the HTTP areas, and the only place errors become them: `/v1` answers
//! `{error: {message, type, param, code: null}}` (the spec's compatible API mapping), the
//! REST API and everything else `{error: <message>}`. Framework errors (malformed JSON,
//! unknown fields, unknown routes, wrong methods) are rewritten here too, so no default body
//! leaks. Both are declared in the OpenAPI document with every status a route can return.

use http::StatusCode;
use poem::{IntoResponse, Response};
use poem_openapi::payload::Json;
use poem_openapi::registry::{MetaMediaType, MetaResponse, MetaResponses, Registry};
use poem_openapi::types::Type;
use poem_openapi::{ApiResponse, Object};

use crate::api::error::GatewayError;

/// Which error body a path gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Area {
    /// `/v1/...`: the compatible API.
    V1,
    /// Everything else.
    Rest,
}

impl Area {
    pub fn of(path: &str) -> Self {
        if path == "/v1" || path.starts_with("/v1/") {
            Self::V1
        } else {
            Self::Rest
        }
    }
}

/// `error.type` for a status, per the spec's table; any other status is a `server_error`.
pub fn openai_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        429 => "rate_limit_error",
        _ => "server_error",
    }
}

/// The inner object of a `/v1` error.
#[derive(Debug, Clone, Object, serde::Serialize)]
#[oai(rename = "OpenAIErrorDetail")]
pub struct OpenAiErrorDetail {
    /// What went wrong, for people.
    pub message: String,
    /// `invalid_request_error`, `authentication_error`, `permission_error`, `not_found_error`,
    /// `rate_limit_error` or `server_error`.
    #[oai(rename = "type")]
    #[serde(rename = "type")]
    pub kind: String,
    /// The request field at fault, when one is.
    #[oai(nullable)]
    pub param: Option<String>,
    /// Always null.
    #[oai(nullable)]
    pub code: Option<String>,
}

/// The `/v1` error body.
#[derive(Debug, Clone, Object, serde::Serialize)]
#[oai(rename = "OpenAIError")]
pub struct OpenAiErrorBody {
    pub error: OpenAiErrorDetail,
}

/// The REST error body.
#[derive(Debug, Clone, Object, serde::Serialize)]
#[oai(rename = "RestError")]
pub struct RestErrorBody {
    /// What went wrong, for people.
    pub error: String,
}

/// An HTTP error: a status and a message safe to show (internal details are logged).
#[derive(Debug, Clone)]
pub struct Problem {
    pub status: StatusCode,
    pub message: String,
    pub param: Option<String>,
}

impl Problem {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            param: None,
        }
    }
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }
    pub fn invalid_param(param: &str, message: impl Into<String>) -> Self {
        Self {
            param: Some(param.to_owned()),
            ..Self::bad_request(message)
        }
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, message)
    }
    pub fn unauthorized() -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "Missing or invalid bearer token")
    }
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, message)
    }
    pub fn internal() -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "Internal error")
    }

    /// The body of this error in `area`'s format.
    pub fn into_area_response(self, area: Area) -> Response {
        let status = self.status;
        let mut resp = match area {
            Area::V1 => poem::web::Json(OpenAiErrorBody {
                error: OpenAiErrorDetail {
                    message: self.message,
                    kind: openai_type(status).to_owned(),
                    param: self.param,
                    code: None,
                },
            })
            .with_status(status)
            .into_response(),
            Area::Rest => poem::web::Json(RestErrorBody {
                error: self.message,
            })
            .with_status(status)
            .into_response(),
        };
        if status == StatusCode::UNAUTHORIZED {
            resp.headers_mut().insert(
                http::header::WWW_AUTHENTICATE,
                http::HeaderValue::from_static("Bearer"),
            );
        }
        resp
    }

    /// A framework error (routing, extraction, payload parsing) as a problem. Its text is
    /// shown only for client errors, which describe the request, never the server.
    pub fn from_poem(err: &poem::Error) -> Self {
        let status = err.status();
        if status.is_server_error() {
            tracing::error!(error = %err, "request failed");
            return Self::internal();
        }
        let message = match status {
            StatusCode::NOT_FOUND => "Not found".to_owned(),
            StatusCode::METHOD_NOT_ALLOWED => "Method not allowed".to_owned(),
            StatusCode::UNAUTHORIZED => "Missing or invalid bearer token".to_owned(),
            StatusCode::PAYLOAD_TOO_LARGE => "Request body too large".to_owned(),
            _ => clean_parse_message(&err.to_string()),
        };
        Self::new(status, message)
    }
}

/// poem-openapi's payload errors read `parse request payload error: failed to parse "X": ...`;
/// keep the part that names the field.
fn clean_parse_message(text: &str) -> String {
    let text = text
        .strip_prefix("parse request payload error: ")
        .unwrap_or(text);
    let text = match text.strip_prefix("failed to parse \"") {
        Some(rest) => rest.split_once("\": ").map_or(rest, |(_, r)| r),
        None => text,
    };
    let mut out: String = text.chars().take(300).collect();
    if out.is_empty() {
        out = "Bad request".to_owned();
    }
    format!("Invalid request: {out}")
}

impl From<GatewayError> for Problem {
    fn from(e: GatewayError) -> Self {
        match e {
            GatewayError::InvalidParams(m) => Self::bad_request(m),
            GatewayError::NotFound(m) => Self::not_found(m),
            GatewayError::Conflict(m) => Self::new(StatusCode::CONFLICT, m),
            GatewayError::Unavailable(m) => Self::new(StatusCode::SERVICE_UNAVAILABLE, m),
            GatewayError::Busy(m) | GatewayError::RateLimited(m) => {
                Self::new(StatusCode::TOO_MANY_REQUESTS, m)
            }
            GatewayError::Internal(detail) => {
                tracing::error!(error = %detail, "request failed");
                Self::internal()
            }
        }
    }
}

/// Every status an API route can answer with an error.
const STATUSES: &[(u16, &str)] = &[
    (
        400,
        "Invalid request (malformed JSON, unknown or invalid field)",
    ),
    (401, "Missing or invalid bearer token"),
    (403, "The token lacks the scope this route requires"),
    (404, "Unknown model, agent or resource"),
    (
        409,
        "The resource refuses the operation in its current state (e.g. a suspended agent)",
    ),
    (
        410,
        "The media file expired (`media.ttlSeconds`; media routes only)",
    ),
    (413, "Request body over gateway.httpBodyLimitBytes"),
    (
        415,
        "A request body that is not `Content-Type: application/json`",
    ),
    (
        429,
        "Global rate limit exceeded (Retry-After says when to retry)",
    ),
    (500, "Internal error"),
    (
        502,
        "The model call failed upstream (the message names the error kind and the upstream's status)",
    ),
    (503, "No provider can serve the request right now"),
];

fn error_meta<B: Type>() -> MetaResponses {
    MetaResponses {
        responses: STATUSES
            .iter()
            .map(|(status, description)| MetaResponse {
                description,
                status: Some(*status),
                status_range: None,
                content: vec![MetaMediaType {
                    content_type: "application/json; charset=utf-8",
                    schema: <Json<B> as poem_openapi::payload::Payload>::schema_ref(),
                }],
                headers: vec![],
            })
            .collect(),
    }
}

/// A `/v1` route's error.
#[derive(Debug)]
pub struct V1Error(pub Problem);

/// A REST route's error.
#[derive(Debug)]
pub struct RestError(pub Problem);

impl<T: Into<Problem>> From<T> for V1Error {
    fn from(p: T) -> Self {
        Self(p.into())
    }
}

impl<T: Into<Problem>> From<T> for RestError {
    fn from(p: T) -> Self {
        Self(p.into())
    }
}

impl std::fmt::Display for V1Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.message)
    }
}

impl std::fmt::Display for RestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.message)
    }
}

impl std::error::Error for V1Error {}
impl std::error::Error for RestError {}

impl poem::error::ResponseError for V1Error {
    fn status(&self) -> StatusCode {
        self.0.status
    }
    fn as_response(&self) -> Response {
        self.0.clone().into_area_response(Area::V1)
    }
}

impl poem::error::ResponseError for RestError {
    fn status(&self) -> StatusCode {
        self.0.status
    }
    fn as_response(&self) -> Response {
        self.0.clone().into_area_response(Area::Rest)
    }
}

/// Whether a poem error already carries its final body (ours, or a prepared response).
pub fn is_final(e: &poem::Error) -> bool {
    e.is_from_response() || e.is::<V1Error>() || e.is::<RestError>()
}

impl IntoResponse for V1Error {
    fn into_response(self) -> Response {
        self.0.into_area_response(Area::V1)
    }
}

impl IntoResponse for RestError {
    fn into_response(self) -> Response {
        self.0.into_area_response(Area::Rest)
    }
}

impl ApiResponse for V1Error {
    fn meta() -> MetaResponses {
        error_meta::<OpenAiErrorBody>()
    }
    fn register(registry: &mut Registry) {
        OpenAiErrorBody::register(registry);
    }
}

impl ApiResponse for RestError {
    fn meta() -> MetaResponses {
        error_meta::<RestErrorBody>()
    }
    fn register(registry: &mut Registry) {
        RestErrorBody::register(registry);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_the_spec_types() {
        for (s, t) in [
            (400, "invalid_request_error"),
            (401, "authentication_error"),
            (403, "permission_error"),
            (404, "not_found_error"),
            (429, "rate_limit_error"),
            (500, "server_error"),
            (413, "server_error"),
            (503, "server_error"),
        ] {
            assert_eq!(openai_type(StatusCode::from_u16(s).unwrap_or_default()), t);
        }
        assert_eq!(Area::of("/v1/models"), Area::V1);
        assert_eq!(Area::of("/v1"), Area::V1);
        assert_eq!(Area::of("/v10"), Area::Rest);
        assert_eq!(Area::of("/api/agents"), Area::Rest);
    }

    #[test]
    fn parse_errors_keep_the_field_and_drop_the_prefix() {
        let m = clean_parse_message(
            "parse request payload error: failed to parse \"ChatCompletionRequest\": properties \"foo\" are not allowed",
        );
        assert_eq!(m, "Invalid request: properties \"foo\" are not allowed");
    }
}
