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
pub fn error_chain(err: &dyn std::error::Error) -> String {
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::collections::VecDeque;
    use std::net::IpAddr;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    use super::*;
    use crate::config::net::NetConfig;
    use crate::net::resolve::LookupFuture;
    use crate::net::Class;

    /// What a test server saw: the request head and body of each request.
    type Seen = Arc<Mutex<Vec<String>>>;

    /// Reads one request (head, then as many body bytes as its content-length says).
    async fn read_request(s: &mut TcpStream) -> String {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                let len = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .map_or(0, |v| v.trim().parse::<usize>().unwrap());
                if buf.len() >= end + 4 + len {
                    break;
                }
            }
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        String::from_utf8_lossy(&buf).into_owned()
    }

    /// An HTTP/1.1 server on `addr` (port 0: any) answering each request with `answer(request,
    /// port)` (a raw answer; the connection closes after it). Returns its port and what it saw.
    async fn serve(
        addr: &str,
        answer: impl Fn(&str, u16) -> String + Send + Sync + 'static,
    ) -> (u16, Seen) {
        let listener = TcpListener::bind(addr).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen: Seen = Arc::default();
        let log = seen.clone();
        let answer = Arc::new(answer);
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let (log, answer) = (log.clone(), answer.clone());
                tokio::spawn(async move {
                    let request = read_request(&mut s).await;
                    log.lock().unwrap().push(request.clone());
                    let _ = s.write_all(answer(&request, port).as_bytes()).await;
                    let _ = s.shutdown().await;
                });
            }
        });
        (port, seen)
    }

    fn ok(body: &str) -> String {
        format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
    }

    fn found(location: &str) -> String {
        format!("HTTP/1.1 302 Found\r\nlocation: {location}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
    }

    fn path(request: &str) -> &str {
        request.split_whitespace().nth(1).unwrap_or("")
    }

    fn fetcher(c: NetConfig) -> Fetcher {
        Fetcher::new(NetPolicy::new(&c))
    }

    fn loopback() -> NetConfig {
        NetConfig {
            allow_loopback: true,
            ..NetConfig::default()
        }
    }

    /// Every spelling of 127.0.0.1 the `url` crate accepts for http(s), and the `localhost`
    /// names: refused with loopback closed (before any connection), fetched with it open.
    #[tokio::test]
    async fn loopback_spellings_are_refused_closed_and_fetched_open() {
        let (port, seen) = serve("127.0.0.1:0", |_, _| ok("hello")).await;
        let spellings = [
            "127.0.0.1",
            "2130706433",
            "0x7f000001",
            "017700000001",
            "127.1",
            "0177.0.0.1",
            "0x7f.1",
            "127.0.0.1.",
            "localhost",
            "localhost.",
            "LOCALHOST",
            "api.localhost",
            "[::ffff:127.0.0.1]",
            "[::ffff:7f00:1]",
        ];
        let closed = fetcher(NetConfig::default());
        for host in spellings {
            let url = format!("http://{host}:{port}/x");
            match closed.get(&url).await {
                Err(NetError::Refused { class, .. }) => assert_eq!(class, Class::Loopback, "{url}"),
                other => panic!("{url}: {other:?}"),
            }
        }
        assert!(
            seen.lock().unwrap().is_empty(),
            "a refused URL was connected to"
        );
        let open = fetcher(loopback());
        for host in spellings {
            let url = format!("http://{host}:{port}/x");
            let answer = open
                .get(&url)
                .await
                .unwrap_or_else(|e| panic!("{url}: {e}"));
            assert_eq!(answer.body, "hello", "{url}");
        }
        assert_eq!(seen.lock().unwrap().len(), spellings.len());
        // The mapped spelling was normalised by the url crate, then judged by its IPv4.
        let t = open
            .policy()
            .check_url(&format!("http://2130706433:{port}/"))
            .unwrap();
        assert_eq!(t.literal, Some(IpAddr::from([127, 0, 0, 1])));
    }

    #[tokio::test]
    async fn userinfo_and_other_schemes_are_refused() {
        let open = fetcher(loopback());
        for url in [
            "http://user@127.0.0.1:1/",
            "http://user:secret@127.0.0.1:1/",
            "https://:pw@example.com/",
        ] {
            let err = open.get(url).await.unwrap_err();
            assert!(matches!(err, NetError::Userinfo { .. }), "{url}: {err:?}");
            assert!(
                !err.to_string().contains("secret") && !err.to_string().contains("pw@"),
                "{err}"
            );
        }
        for url in [
            "ftp://127.0.0.1/",
            "file:///etc/passwd",
            "gopher://127.0.0.1:70/",
        ] {
            assert!(
                matches!(open.get(url).await, Err(NetError::Scheme { .. })),
                "{url}"
            );
        }
        assert!(matches!(
            open.get("not a url").await,
            Err(NetError::InvalidUrl { .. })
        ));
    }

    /// A loopback server redirecting to the metadata address: refused however open the policy
    /// is (allowCidrs included), and the metadata address is never connected to.
    #[tokio::test]
    async fn a_redirect_to_metadata_is_refused_whatever_the_policy() {
        let (port, _) = serve("127.0.0.1:0", |r, _| match path(r) {
            "/v4" => found("http://169.254.169.254/latest/meta-data/"),
            "/mapped" => found("http://[::ffff:a9fe:a9fe]/"),
            "/nat64" => found("http://[64:ff9b::a9fe:a9fe]/"),
            _ => found("http://100.100.100.200/"),
        })
        .await;
        let wide = NetConfig {
            allow_loopback: true,
            allow_private: true,
            allow_cidrs: vec!["0.0.0.0/0".parse().unwrap(), "::/0".parse().unwrap()],
            ..NetConfig::default()
        };
        for c in [loopback(), wide] {
            let f = fetcher(c);
            for p in ["/v4", "/mapped", "/nat64", "/alibaba"] {
                match f.get(&format!("http://127.0.0.1:{port}{p}")).await {
                    Err(NetError::Refused { class, url, .. }) => {
                        assert_eq!(class, Class::Metadata, "{p}");
                        assert!(
                            !url.contains("127.0.0.1"),
                            "the refused hop is named: {url}"
                        );
                    }
                    other => panic!("{p}: {other:?}"),
                }
            }
        }
    }

    /// `/r/N` redirects to `/r/N-1` (relative and absolute locations alternating) down to
    /// `/r/0`, which answers.
    #[tokio::test]
    async fn redirects_up_to_the_limit_are_followed_and_one_more_is_an_error() {
        let (port, _) = serve("127.0.0.1:0", |r, port| {
            let n: u32 = path(r).trim_start_matches("/r/").parse().unwrap_or(0);
            match n {
                0 => ok("done"),
                n if n % 2 == 0 => found(&format!("http://localhost:{port}/r/{}", n - 1)),
                n => found(&format!("/r/{}", n - 1)),
            }
        })
        .await;
        let f = fetcher(NetConfig {
            max_redirects: 3,
            ..loopback()
        });
        let at = f
            .get(&format!("http://127.0.0.1:{port}/r/3"))
            .await
            .unwrap();
        assert_eq!((at.body.as_ref(), at.redirects), (b"done".as_ref(), 3));
        assert_eq!(at.url.path(), "/r/0");
        let past = f
            .get(&format!("http://127.0.0.1:{port}/r/4"))
            .await
            .unwrap_err();
        assert!(
            matches!(past, NetError::TooManyRedirects { max: 3, .. }),
            "{past:?}"
        );
        let none = fetcher(NetConfig {
            max_redirects: 0,
            ..loopback()
        });
        assert!(none
            .get(&format!("http://127.0.0.1:{port}/r/0"))
            .await
            .is_ok());
        assert!(matches!(
            none.get(&format!("http://127.0.0.1:{port}/r/1")).await,
            Err(NetError::TooManyRedirects { .. })
        ));
    }

    #[tokio::test]
    async fn the_body_is_capped_at_max_bytes() {
        let (port, _) = serve("127.0.0.1:0", |r, _| match path(r) {
            "/exact" => ok(&"a".repeat(16)),
            "/over" => ok(&"a".repeat(17)),
            // No length: read until the connection closes.
            "/stream-exact" => format!(
                "HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n{}",
                "b".repeat(16)
            ),
            _ => format!(
                "HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n{}",
                "b".repeat(17)
            ),
        })
        .await;
        let f = fetcher(NetConfig {
            max_bytes: 16,
            ..loopback()
        });
        for p in ["/exact", "/stream-exact"] {
            let a = f.get(&format!("http://127.0.0.1:{port}{p}")).await.unwrap();
            assert_eq!(a.body.len(), 16, "{p}");
        }
        for p in ["/over", "/stream-over"] {
            let err = f
                .get(&format!("http://127.0.0.1:{port}{p}"))
                .await
                .unwrap_err();
            assert!(
                matches!(err, NetError::TooLarge { max: 16, .. }),
                "{p}: {err:?}"
            );
        }
    }

    /// A lookup that answers from a script and counts its calls.
    struct Scripted {
        answers: Mutex<VecDeque<IpAddr>>,
        calls: AtomicUsize,
    }

    impl Lookup for Scripted {
        fn lookup(&self, _host: &str) -> LookupFuture {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let next = self.answers.lock().unwrap().pop_front();
            Box::pin(async move { Ok(next.into_iter().collect()) })
        }
    }

    /// DNS rebinding: the name resolves to an allowed address when checked, then to 127.0.0.1.
    /// The connection goes to the vetted address (one lookup per hop, none by the connector);
    /// the next fetch sees the new answer and is refused.
    #[tokio::test]
    async fn the_connection_goes_only_to_the_vetted_address() {
        let (port, vetted) = serve("127.0.0.2:0", |_, _| ok("vetted")).await;
        let (_, rebound) = serve(&format!("127.0.0.1:{port}"), |_, _| ok("rebound")).await;
        let lookup = Arc::new(Scripted {
            answers: Mutex::new(VecDeque::from([
                IpAddr::from([127, 0, 0, 2]),
                IpAddr::from([127, 0, 0, 1]),
            ])),
            calls: AtomicUsize::new(0),
        });
        let f = fetcher(NetConfig {
            allow_cidrs: vec!["127.0.0.2/32".parse().unwrap()],
            ..NetConfig::default()
        })
        .with_lookup(lookup.clone());
        let url = format!("http://rebind.example:{port}/");
        let answer = f.get(&url).await.unwrap();
        assert_eq!(answer.body, "vetted");
        assert_eq!(
            lookup.calls.load(Ordering::SeqCst),
            1,
            "the connector resolved again"
        );
        assert_eq!(vetted.lock().unwrap().len(), 1);
        assert!(
            vetted.lock().unwrap()[0]
                .to_ascii_lowercase()
                .contains("host: rebind.example"),
            "the Host header names the URL's host"
        );
        match f.get(&url).await {
            Err(NetError::Refused { class, address, .. }) => {
                assert_eq!((class, address.as_str()), (Class::Loopback, "127.0.0.1"));
            }
            other => panic!("{other:?}"),
        }
        assert!(rebound.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn allow_cidrs_opens_loopback_but_never_metadata() {
        let (port, _) = serve("127.0.0.1:0", |_, _| ok("in range")).await;
        let c = NetConfig {
            allow_cidrs: vec![
                "127.0.0.0/8".parse().unwrap(),
                "169.254.169.254/32".parse().unwrap(),
            ],
            ..NetConfig::default()
        };
        let f = fetcher(c.clone());
        assert_eq!(
            f.get(&format!("http://127.0.0.1:{port}/"))
                .await
                .unwrap()
                .body,
            "in range"
        );
        assert_eq!(
            f.get(&format!("http://[::ffff:127.0.0.1]:{port}/"))
                .await
                .unwrap()
                .body,
            "in range"
        );
        let p = NetPolicy::new(&c);
        assert_eq!(
            p.refused("169.254.169.254".parse().unwrap()),
            Some(Class::Metadata)
        );
        assert_eq!(p.refused("10.0.0.1".parse().unwrap()), Some(Class::Private));
        assert!(matches!(
            f.get("http://169.254.169.254/latest/").await,
            Err(NetError::Refused {
                class: Class::Metadata,
                ..
            })
        ));
        // localhost also answers ::1, outside the range: refused rather than half-allowed.
        assert!(matches!(
            f.get(&format!("http://localhost:{port}/")).await,
            Err(NetError::Refused { .. })
        ));
    }

    #[tokio::test]
    async fn the_whole_fetch_has_a_deadline() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let hold = tokio::spawn(async move {
            let (s, _) = listener.accept().await.unwrap();
            tokio::time::sleep(Duration::from_secs(30)).await;
            drop(s);
        });
        let f = fetcher(NetConfig {
            timeout_ms: 200,
            ..loopback()
        });
        let started = std::time::Instant::now();
        let err = f
            .get(&format!("http://127.0.0.1:{port}/"))
            .await
            .unwrap_err();
        assert!(matches!(err, NetError::Timeout { .. }), "{err:?}");
        assert!(started.elapsed() < Duration::from_secs(5));
        hold.abort();
    }

    /// POST with a body and headers; a 307 keeps both, a 303 turns into a GET, a redirect to
    /// another origin drops the credentials; an error status is `Http`.
    #[tokio::test]
    async fn post_redirects_and_statuses() {
        let (port, seen) = serve("127.0.0.1:0", |r, port| match path(r) {
            "/307" => "HTTP/1.1 307 Temporary Redirect\r\nlocation: /echo\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".to_owned(),
            "/303" => format!("HTTP/1.1 303 See Other\r\nlocation: http://localhost:{port}/echo\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"),
            "/echo" => ok("echoed"),
            _ => "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".to_owned(),
        })
        .await;
        let f = fetcher(loopback());
        let post = |p: &str| {
            Request::post(format!("http://127.0.0.1:{port}{p}"), r#"{"x":1}"#)
                .header(
                    http::header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                )
                .header(AUTHORIZATION, HeaderValue::from_static("Bearer t0ken"))
        };
        assert_eq!(f.send(post("/307")).await.unwrap().body, "echoed");
        let last = seen.lock().unwrap().last().unwrap().clone();
        assert!(last.starts_with("POST /echo "), "{last}");
        assert!(
            last.ends_with(r#"{"x":1}"#) && last.contains("Bearer t0ken"),
            "{last}"
        );
        assert_eq!(f.send(post("/303")).await.unwrap().body, "echoed");
        let last = seen.lock().unwrap().last().unwrap().clone();
        assert!(last.starts_with("GET /echo "), "{last}");
        assert!(
            !last.contains("t0ken") && !last.contains(r#"{"x":1}"#),
            "{last}"
        );
        assert!(matches!(
            f.get(&format!("http://127.0.0.1:{port}/missing")).await,
            Err(NetError::Http { status: 404, .. })
        ));
    }
}
