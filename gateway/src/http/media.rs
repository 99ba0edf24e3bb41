//! `GET /media/<id>` and `GET /media/<id>/meta`: files saved by agents and tools, as typed
//! operations of the OpenAPI document. A bearer token with scope `rpc` (or `admin`) is
//! required, since this gateway always has a token store; invalid ids and paths outside the
//! media root are simply not found.

use std::sync::Arc;

use http::{header, HeaderValue, StatusCode};
use poem::web::Data;
use poem::{Body, IntoResponse, Response};
use poem_openapi::param::Path;
use poem_openapi::payload::Json;
use poem_openapi::registry::{
    MetaMediaType, MetaResponse, MetaResponses, MetaSchema, MetaSchemaRef, Registry,
};
use poem_openapi::{ApiResponse, Object, OpenApi, Tags};

use crate::app::state::AppState;
use crate::http::security::RestBearer;
use crate::media::{MediaError, MediaFile};
use crate::transport::problem::{Problem, RestError};

#[derive(Tags)]
enum MediaTag {
    /// Files saved by agents and tools.
    Media,
}

/// A media file's metadata.
#[derive(Object)]
#[oai(rename_all = "camelCase")]
pub struct MediaMetaOut {
    pub id: String,
    /// From the sidecar, else from the extension.
    pub content_type: String,
    /// Unix epoch milliseconds.
    pub saved_at: i64,
    /// Bytes.
    pub size: u64,
    /// The name the file was saved under, when known.
    #[oai(skip_serializing_if_is_none)]
    pub file_name: Option<String>,
}

impl From<MediaError> for Problem {
    fn from(e: MediaError) -> Self {
        match e {
            MediaError::Expired => Problem::new(StatusCode::GONE, "Media expired"),
            MediaError::Io(detail) => {
                tracing::error!(error = %detail, "media read failed");
                Problem::internal()
            }
            // Invalid ids are not found: they never name a file.
            _ => Problem::not_found("Media not found"),
        }
    }
}

/// The file's bytes with its own content type (any type, so declared as `*/*`).
pub struct MediaBody {
    file: MediaFile,
    body: Body,
}

impl IntoResponse for MediaBody {
    fn into_response(self) -> Response {
        let f = self.file;
        let mut resp = Response::builder()
            .status(StatusCode::OK)
            .header(header::CONTENT_LENGTH, f.meta.size)
            .header(header::CACHE_CONTROL, "private, max-age=0")
            .body(self.body);
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
        resp
    }
}

impl ApiResponse for MediaBody {
    fn meta() -> MetaResponses {
        MetaResponses {
            responses: vec![MetaResponse {
                description:
                    "The file with its content type; HTML, SVG, XML and scripts as an attachment",
                status: Some(200),
                status_range: None,
                content: vec![MetaMediaType {
                    content_type: "*/*",
                    schema: MetaSchemaRef::Inline(Box::new(MetaSchema {
                        format: Some("binary"),
                        ..MetaSchema::new("string")
                    })),
                }],
                headers: vec![],
            }],
        }
    }

    fn register(_registry: &mut Registry) {}
}

pub struct MediaApi;

/// The file if the caller's tenant owns it (admin: any file); another tenant's is 404.
async fn lookup(state: &AppState, auth: &RestBearer, id: &str) -> Result<MediaFile, RestError> {
    let tenant = auth.0.tenant();
    Ok(state
        .engine
        .media
        .get_for(id, crate::clock::now_ms(), tenant)
        .await?)
}

#[OpenApi]
impl MediaApi {
    /// A media file
    ///
    /// 404 for a missing or invalid id, 410 once the file is older than `media.ttlSeconds`.
    #[oai(
        path = "/media/:id",
        method = "get",
        tag = "MediaTag::Media",
        operation_id = "mediaFile"
    )]
    async fn file(
        &self,
        state: Data<&Arc<AppState>>,
        auth: RestBearer,
        /// Letters, digits, `.`, `-` and `_`.
        id: Path<String>,
    ) -> Result<MediaBody, RestError> {
        let file = lookup(&state, &auth, &id).await?;
        let opened = tokio::fs::File::open(&file.path).await.map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                // Swept between the lookup and here.
                MediaError::NotFound
            } else {
                MediaError::Io(e.to_string())
            }
        })?;
        Ok(MediaBody {
            file,
            body: Body::from_async_read(opened),
        })
    }

    /// A media file's metadata
    #[oai(
        path = "/media/:id/meta",
        method = "get",
        tag = "MediaTag::Media",
        operation_id = "mediaMeta"
    )]
    async fn meta(
        &self,
        state: Data<&Arc<AppState>>,
        auth: RestBearer,
        /// Letters, digits, `.`, `-` and `_`.
        id: Path<String>,
    ) -> Result<Json<MediaMetaOut>, RestError> {
        let m = lookup(&state, &auth, &id).await?.meta;
        Ok(Json(MediaMetaOut {
            id: m.id,
            content_type: m.content_type,
            saved_at: m.saved_at,
            size: m.size,
            file_name: m.file_name,
        }))
    }
}
