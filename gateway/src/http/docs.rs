//! The JSON-RPC contract over HTTP: `/openrpc.json` (the OpenRPC document) and the method
//! pages under `/docs/rpc/`, both rendered from the catalogue at build time and embedded in the
//! binary. Plain routes (not part of the OpenAPI document), served without a token while
//! `gateway.docs.enabled`.

use poem::http::{header, HeaderValue, StatusCode};
use poem::web::Redirect;
use poem::{handler, IntoResponse, Request, Response};

use crate::transport::problem::{Area, Problem};

mod embedded {
    include!(concat!(env!("OUT_DIR"), "/contract_docs.rs"));
}

pub use embedded::{OPENRPC_JSON, RPC_PAGES};

/// Where the method pages are mounted.
pub const RPC_DOCS_PATH: &str = "/docs/rpc";

/// The pages hold no script and load nothing from elsewhere; the policy keeps it that way
/// even if a catalogue text ever slipped past the escaping.
const PAGE_CSP: &str = "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; \
form-action 'none'; frame-ancestors 'none'";

/// A page by file name (`index.html`, `<namespace>.html`, `types.html`).
pub fn page(name: &str) -> Option<&'static str> {
    RPC_PAGES
        .binary_search_by(|(n, _)| (*n).cmp(name))
        .ok()
        .and_then(|i| RPC_PAGES.get(i))
        .map(|(_, text)| *text)
}

#[handler]
pub fn openrpc() -> Response {
    Response::builder()
        .content_type("application/json")
        .body(OPENRPC_JSON)
}

/// `/docs/rpc` (mounted with `nest`, so the path here is what follows it).
#[handler]
pub fn rpc_pages(req: &Request) -> Response {
    // Relative links between the pages need the directory form (`nest` hands this handler
    // "/" for both `/docs/rpc` and `/docs/rpc/`, so the original path decides).
    if req.original_uri().path() == RPC_DOCS_PATH {
        return Redirect::permanent(format!("{RPC_DOCS_PATH}/")).into_response();
    }
    let name = match req.uri().path().trim_start_matches('/') {
        "" => "index.html",
        other => other,
    };
    match page(name) {
        Some(text) => {
            let mut resp = Response::builder()
                .content_type("text/html; charset=utf-8")
                .body(text);
            resp.headers_mut().insert(
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static(PAGE_CSP),
            );
            resp
        }
        None => Problem::new(StatusCode::NOT_FOUND, "Not found").into_area_response(Area::Rest),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use crate::api::generated::methods::NAMESPACES;

    #[test]
    fn every_namespace_has_an_embedded_page_and_lookup_is_exact() {
        assert!(page("index.html").is_some());
        assert!(page("types.html").is_some());
        for ns in NAMESPACES {
            assert!(page(&format!("{ns}.html")).is_some(), "{ns}");
        }
        assert_eq!(RPC_PAGES.len(), NAMESPACES.len() + 2);
        for bad in [
            "",
            "index",
            "../index.html",
            "session.html/",
            "SESSION.html",
        ] {
            assert!(page(bad).is_none(), "{bad}");
        }
    }
}
