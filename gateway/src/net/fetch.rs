//! The pinned fetcher: one HTTP request to a URL nobody vetted, made safe. Each hop checks the
//! URL ([`NetPolicy::check_url`]), resolves the host once and checks every address
//! ([`NetPolicy::vet`]), then connects through a [`Resolve::pinned`] resolver that answers with
//! exactly those addresses (the connector never resolves again, so a DNS answer that changes
//! between the check and the connection changes nothing). Redirects are followed by hand, each
//! hop checked from scratch, at most `max_redirects`; no proxy from the environment is ever
//! used; the body is capped at `max_bytes` and the whole fetch at `timeout`. Built on the
//! same hyper 1 + hyper-util + hyper-rustls stack as the providers' clients.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::{
    HeaderMap, HeaderValue, AUTHORIZATION, CONTENT_LENGTH, COOKIE, LOCATION, PROXY_AUTHORIZATION,
    USER_AGENT,
};
use http::{Method, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use super::error::NetError;
use super::policy::NetPolicy;
use super::resolve::{Lookup, Resolve, SystemLookup};
use super::tls::shared_tls_config;

/// Longest wait for one TCP/TLS connection (capped by the fetch's timeout).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const USER_AGENT_VALUE: &str = concat!("agent-gateway/", env!("CARGO_PKG_VERSION"));

/// One request: GET by default; POST with a body and headers for callers that need it.
#[derive(Debug, Clone)]
pub struct Request {
    pub method: Method,
    pub url: String,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Request {
    pub fn get(url: impl Into<String>) -> Self {
        Self {
            method: Method::GET,
            url: url.into(),
            headers: HeaderMap::new(),
            body: Bytes::new(),
        }
    }

    pub fn post(url: impl Into<String>, body: impl Into<Bytes>) -> Self {
        Self {
            method: Method::POST,
            body: body.into(),
            ..Self::get(url)
        }
    }

    /// Adds a header (sent to the first origin; dropped if a redirect leaves it, for the
    /// credentials among them).
    pub fn header(mut self, name: http::header::HeaderName, value: HeaderValue) -> Self {
        self.headers.append(name, value);
        self
    }
}

/// A 2xx answer, read whole.
#[derive(Debug, Clone)]
pub struct Response {
    /// The URL that answered (the last hop).
    pub url: url::Url,
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// Redirects followed to get here.
    pub redirects: u32,
}

type HopClient = Client<HttpsConnector<HttpConnector<Resolve>>, Full<Bytes>>;

/// Fetches URLs under a [`NetPolicy`].
#[derive(Clone)]
pub struct Fetcher {
    policy: Arc<NetPolicy>,
    lookup: Arc<dyn Lookup>,
    tls: Result<rustls::ClientConfig, String>,
}

impl Fetcher {
    /// A fetcher on the system resolver and the process's TLS settings.
    pub fn new(policy: NetPolicy) -> Self {
        Self {
            policy: Arc::new(policy),
            lookup: Arc::new(SystemLookup),
            tls: shared_tls_config(),
        }
    }

    /// Resolves host names with `lookup` instead of the system resolver.
    #[must_use]
    pub fn with_lookup(mut self, lookup: Arc<dyn Lookup>) -> Self {
        self.lookup = lookup;
        self
    }

    /// Uses these TLS settings (extra roots, for tests against a private CA).
    #[must_use]
    pub fn with_tls(mut self, tls: rustls::ClientConfig) -> Self {
        self.tls = Ok(tls);
        self
    }

    pub fn policy(&self) -> &NetPolicy {
        &self.policy
    }

    /// GETs `url`.
    pub async fn get(&self, url: &str) -> Result<Response, NetError> {
        self.send(Request::get(url)).await
    }

    /// Sends `request`, following redirects, under the policy's timeout.
    pub async fn send(&self, request: Request) -> Result<Response, NetError> {
        let url = request.url.clone();
        let after = self.policy.timeout;
        match tokio::time::timeout(after, self.follow(request)).await {
            Ok(result) => result,
            Err(_) => Err(NetError::Timeout { url, after }),
        }
    }

    async fn follow(&self, mut request: Request) -> Result<Response, NetError> {
        let mut redirects = 0u32;
        let mut current = request.url.clone();
        loop {
            let target = self.policy.check_url(&current)?;
            let addresses = self.policy.vet(&target, self.lookup.as_ref()).await?;
            let mut url = target.url;
            url.set_fragment(None);
            let answer = self.hop(&url, addresses, &request).await?;
            let (parts, body) = answer.into_parts();
            let location = parts
                .headers
                .get(LOCATION)
                .and_then(|v| v.to_str().ok())
                .filter(|_| is_redirect(parts.status));
            if let Some(location) = location {
                let next = url
                    .join(location.trim())
                    .map_err(|e| NetError::InvalidUrl {
                        url: location.to_owned(),
                        reason: format!("a redirect from {url} to an unusable location: {e}"),
                    })?;
                if redirects >= self.policy.max_redirects {
                    return Err(NetError::TooManyRedirects {
                        url: url.as_str().to_owned(),
                        max: self.policy.max_redirects,
                    });
                }
                redirects += 1;
                drop(body);
                redirect(&mut request, parts.status, &url, &next);
                current = next.as_str().to_owned();
                continue;
            }
            if !parts.status.is_success() {
                return Err(NetError::Http {
                    url: url.as_str().to_owned(),
                    status: parts.status.as_u16(),
                });
            }
            let body = self.read(&url, &parts.headers, body).await?;
            return Ok(Response {
                url,
                status: parts.status,
                headers: parts.headers,
                body,
                redirects,
            });
        }
    }

    /// One request to `url`, connecting only to `addresses`.
    async fn hop(
        &self,
        url: &url::Url,
        addresses: Vec<std::net::IpAddr>,
        request: &Request,
    ) -> Result<http::Response<hyper::body::Incoming>, NetError> {
        let io = |reason: String| NetError::Io {
            url: url.as_str().to_owned(),
            reason,
        };
        let uri: Uri = url
            .as_str()
            .parse()
            .map_err(|e: http::uri::InvalidUri| io(e.to_string()))?;
        let client = self.client(addresses).map_err(io)?;
        let mut req = http::Request::new(Full::new(request.body.clone()));
        *req.method_mut() = request.method.clone();
        *req.uri_mut() = uri;
        *req.headers_mut() = request.headers.clone();
        req.headers_mut()
            .entry(USER_AGENT)
            .or_insert(HeaderValue::from_static(USER_AGENT_VALUE));
        client.request(req).await.map_err(|e| io(error_chain(&e)))
    }

    /// A client for one hop: no pool kept, no proxy, the pinned resolver.
    fn client(&self, addresses: Vec<std::net::IpAddr>) -> Result<HopClient, String> {
        let tls = self
            .tls
            .clone()
            .map_err(|e| format!("cannot build the TLS settings: {e}"))?;
        let mut http = HttpConnector::new_with_resolver(Resolve::pinned(addresses));
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(CONNECT_TIMEOUT.min(self.policy.timeout)));
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .enable_http2()
            .wrap_connector(http);
        Ok(Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(0)
            .timer(TokioTimer::new())
            .build(connector))
    }

    /// The body, at most `max_bytes` (one byte more is an error; a declared length past it is
    /// refused before reading).
    async fn read(
        &self,
        url: &url::Url,
        headers: &HeaderMap,
        mut body: hyper::body::Incoming,
    ) -> Result<Bytes, NetError> {
        let max = self.policy.max_bytes;
        let too_large = || NetError::TooLarge {
            url: url.as_str().to_owned(),
            max,
        };
        let declared = headers
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        if declared.is_some_and(|n| n > max) {
            return Err(too_large());
        }
        let mut out = BytesMut::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| NetError::Io {
                url: url.as_str().to_owned(),
                reason: error_chain(&e),
            })?;
            if let Ok(chunk) = frame.into_data() {
                if (out.len() as u64).saturating_add(chunk.len() as u64) > max {
                    return Err(too_large());
                }
                out.extend_from_slice(&chunk);
            }
        }
        Ok(out.freeze())
    }
}

fn is_redirect(status: StatusCode) -> bool {
    matches!(status.as_u16(), 301 | 302 | 303 | 307 | 308)
}

/// The request of the next hop: 303 (and 301/302 after a POST, as browsers do) becomes a GET
/// without a body; credentials and cookies are not sent to another origin.
fn redirect(request: &mut Request, status: StatusCode, from: &url::Url, to: &url::Url) {
    let to_get = status == StatusCode::SEE_OTHER
        || (matches!(status.as_u16(), 301 | 302) && request.method == Method::POST);
    if to_get && request.method != Method::HEAD {
        request.method = Method::GET;
        request.body = Bytes::new();
        request.headers.remove(http::header::CONTENT_TYPE);
        request.headers.remove(CONTENT_LENGTH);
    }
    if from.origin() != to.origin() {
        for name in [AUTHORIZATION, COOKIE, PROXY_AUTHORIZATION] {
            request.headers.remove(name);
        }
    }
    request.url = to.as_str().to_owned();
}

/// An error and its sources, joined (the outer texts often omit the cause).
fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let part = cause.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = cause.source();
    }
    text
}
