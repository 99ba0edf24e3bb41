//! `GET /media/<id>` and `GET /media/<id>/meta`: files saved by agents and tools. A bearer
//! token with scope `rpc` (or `admin`) is required, since this gateway always has a token
//! store; invalid ids and paths outside the media root are simply not found.

use std::sync::Arc;

use http::{header, HeaderValue, StatusCode};
use poem::web::{Data, Path};
use poem::{handler, Body, IntoResponse, Request, Response};

use crate::http::json_error;
use crate::media::{MediaError, MediaFile};
use crate::rpc::generated::methods::Scope;
use crate::state::AppState;

/// Why a media request is refused.
enum Refused {
    /// No or an unknown token.
    Unauthorized,
    /// A token without `rpc` (e.g. `mcp-client`).
    Forbidden,
    Media(MediaError),
}

impl Refused {
    fn into_response(self) -> Response {
        match self {
            Self::Unauthorized => {
                let mut r = json_error(StatusCode::UNAUTHORIZED, "Unauthorized");
                r.headers_mut()
                    .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
                r
            }
            Self::Forbidden => {
                json_error(StatusCode::FORBIDDEN, "Insufficient scope: requires 'rpc'")
            }
            Self::Media(MediaError::Expired) => json_error(StatusCode::GONE, "Media expired"),
            Self::Media(MediaError::Io(detail)) => {
                tracing::error!(error = %detail, "media read failed");
                json_error(StatusCode::INTERNAL_SERVER_ERROR, "Internal error")
            }
            // Invalid ids are not found: they never name a file.
            Self::Media(_) => json_error(StatusCode::NOT_FOUND, "Media not found"),
        }
    }
}

/// The caller's token must carry `rpc` (or `admin`); then the file is looked up.
async fn lookup(req: &Request, state: &AppState, id: &str) -> Result<MediaFile, Refused> {
    let p = state
        .tokens
        .authenticate(req, false)
        .ok_or(Refused::Unauthorized)?;
    if !(p.scopes.contains(&Scope::Rpc) || p.scopes.contains(&Scope::Admin)) {
        return Err(Refused::Forbidden);
    }
    state
        .engine
        .media
        .get(id, crate::store::now_ms())
        .await
        .map_err(Refused::Media)
}

fn nosniff(mut r: Response) -> Response {
    r.headers_mut().insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    r
}

/// The file, with its content type; active content (HTML, SVG, ...) as an attachment.
#[handler]
pub async fn file_bytes(
    req: &Request,
    Path(id): Path<String>,
    state: Data<&Arc<AppState>>,
) -> Response {
    let f = match lookup(req, &state, &id).await {
        Ok(f) => f,
        Err(r) => return nosniff(r.into_response()),
    };
    let opened = match tokio::fs::File::open(&f.path).await {
        Ok(o) => o,
        // Swept between the lookup and here.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return nosniff(Refused::Media(MediaError::NotFound).into_response())
        }
        Err(e) => return nosniff(Refused::Media(MediaError::Io(e.to_string())).into_response()),
    };
    let mut resp = Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_LENGTH, f.meta.size)
        .header(header::CACHE_CONTROL, "private, max-age=0")
        .body(Body::from_async_read(opened));
    if let Ok(v) = HeaderValue::from_str(&f.meta.content_type) {
        resp.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    let disposition = if f.inline() {
        "inline".to_owned()
    } else {
        format!("attachment; filename=\"{}\"", f.meta.id)
    };
    if let Ok(v) = HeaderValue::from_str(&disposition) {
        resp.headers_mut().insert(header::CONTENT_DISPOSITION, v);
    }
    if !f.inline() {
        resp.headers_mut().insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static("sandbox; default-src 'none'"),
        );
    }
    nosniff(resp)
}

/// `{id, contentType, savedAt, size, fileName?}`.
#[handler]
pub async fn file_meta(
    req: &Request,
    Path(id): Path<String>,
    state: Data<&Arc<AppState>>,
) -> Response {
    match lookup(req, &state, &id).await {
        Ok(f) => nosniff(poem::web::Json(&f.meta).into_response()),
        Err(r) => nosniff(r.into_response()),
    }
}
