//! HTTP plumbing shared by the remote providers (openai, anthropic): one pooled hyper client
//! per provider (HTTP/1.1 and HTTP/2 over rustls, trusting the webpki roots and those of
//! `SSL_CERT_FILE`, or plain HTTP; through `HTTPS_PROXY` /
//! `HTTP_PROXY` / `ALL_PROXY` by CONNECT unless `NO_PROXY` or a loopback base URL says
//! otherwise), the call deadline and cancellation, mapping transport failures and error
//! answers to [`ProviderError`] (with Retry-After), and keeping the API key out of every
//! error message.

use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE, USER_AGENT};
use http::Uri;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::proxy::Tunnel;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::proxy::matcher::Matcher;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::retry::MAX_RETRY_WAIT;
use super::{ErrorKind, ProviderConnection, ProviderError};
use crate::net::{NetPolicy, Resolve};

/// Longest wait for a TCP/TLS connection (capped by the call timeout).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Idle pooled connections are closed after this.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// At most this much of an error answer is read (to find its message).
const ERROR_BODY_LIMIT: usize = 64 * 1024;
/// At most this much of an upstream's error text is logged.
const LOGGED_UPSTREAM_CHARS: usize = 1000;
/// An error answer that is not JSON is quoted up to this many characters.
const ERROR_TEXT_CHARS: usize = 300;
const USER_AGENT_VALUE: &str = concat!("agent-gateway/", env!("CARGO_PKG_VERSION"));

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Conn = TokioIo<tokio::net::TcpStream>;

/// Opens the TCP connection of a call: straight to the server, or through the proxy the
/// environment names for it (an HTTP CONNECT tunnel, for `http://` and `https://` servers
/// alike; TLS to the server then runs inside the tunnel).
#[derive(Clone)]
struct Connect {
    direct: HttpConnector<Resolve>,
    /// Reaches the proxy itself (never guarded: the operator's environment names it).
    to_proxy: HttpConnector,
    proxies: Option<Arc<Matcher>>,
    /// Checks a literal IP host too (the resolver never sees those).
    guard: Option<Arc<NetPolicy>>,
}

impl tower_service::Service<Uri> for Connect {
    type Response = Conn;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Conn, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, dst: Uri) -> Self::Future {
        let direct = self.direct.clone();
        match self.proxies.as_ref().and_then(|m| m.intercept(&dst)) {
            Some(proxy) => {
                let mut tunnel = Tunnel::new(proxy.uri().clone(), self.to_proxy.clone());
                if let Some(auth) = proxy.basic_auth() {
                    tunnel = tunnel.with_auth(auth.clone());
                }
                Box::pin(async move { tunnel.call(dst).await.map_err(BoxError::from) })
            }
            None => {
                let literal = dst
                    .host()
                    .map(|h| h.trim_start_matches('[').trim_end_matches(']'))
                    .and_then(|h| h.parse::<IpAddr>().ok());
                let refused = match (&self.guard, literal) {
                    (Some(guard), Some(ip)) => guard.refused(ip).map(|class| {
                        format!("{ip} is a {class} address the provider policy refuses")
                    }),
                    _ => None,
                };
                let mut direct = direct;
                Box::pin(async move {
                    if let Some(why) = refused {
                        return Err(BoxError::from(why));
                    }
                    direct.call(dst).await.map_err(BoxError::from)
                })
            }
        }
    }
}

/// The client, credentials and deadline of one provider instance.
pub(crate) struct Http {
    client: Client<HttpsConnector<Connect>, Full<Bytes>>,
    api_key: Option<String>,
    /// Sent with every call (the credentials, API version headers).
    headers: HeaderMap,
    timeout: Duration,
}

/// A 2xx answer whose body has not been read yet.
pub(crate) struct Answer {
    headers: HeaderMap,
    body: Incoming,
}

impl Answer {
    pub(crate) fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    pub(crate) fn into_body(self) -> Incoming {
        self.body
    }
}

pub use crate::net::tls::extra_roots_problem;
use crate::net::tls::shared_tls_config;
#[cfg(test)]
use crate::net::tls::tls_config;

impl Http {
    /// Builds the pooled client for `base_url` (already validated by [`base_url`]), through the
    /// proxies the environment names (none for a loopback base URL: a local model server is
    /// never reached through a proxy).
    pub(crate) fn new(
        settings: &ProviderConnection,
        base_url: &str,
    ) -> Result<Self, ProviderError> {
        let proxies = (!is_loopback(base_url)).then(Matcher::from_env);
        Self::with_network(settings, proxies, shared_tls_config())
    }

    /// The client through `proxies`, with the TLS settings `tls` (or the reason there are
    /// none).
    fn with_network(
        settings: &ProviderConnection,
        proxies: Option<Matcher>,
        tls: Result<rustls::ClientConfig, String>,
    ) -> Result<Self, ProviderError> {
        let timeout = settings.timeout;
        let connect_timeout = if timeout.is_zero() {
            CONNECT_TIMEOUT
        } else {
            CONNECT_TIMEOUT.min(timeout)
        };
        let mut direct =
            HttpConnector::new_with_resolver(Resolve::system(settings.address_guard.clone()));
        direct.enforce_http(false);
        direct.set_nodelay(true);
        direct.set_keepalive(Some(Duration::from_secs(60)));
        direct.set_connect_timeout(Some(connect_timeout));
        let mut to_proxy = HttpConnector::new();
        to_proxy.enforce_http(false);
        to_proxy.set_nodelay(true);
        to_proxy.set_keepalive(Some(Duration::from_secs(60)));
        to_proxy.set_connect_timeout(Some(connect_timeout));
        let proxies = proxies.map(Arc::new);
        let tls = tls.map_err(|e| {
            ProviderError::new(
                ErrorKind::Unavailable,
                format!("cannot build the TLS settings: {e}"),
            )
        })?;
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .enable_http2()
            .wrap_connector(Connect {
                direct,
                to_proxy,
                proxies,
                guard: settings.address_guard.clone(),
            });
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .pool_timer(TokioTimer::new())
            .timer(TokioTimer::new())
            .build(connector);
        let mut headers = HeaderMap::new();
        headers.insert(USER_AGENT, HeaderValue::from_static(USER_AGENT_VALUE));
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        Ok(Self {
            client,
            api_key: settings.api_key.clone().filter(|k| !k.is_empty()),
            headers,
            timeout,
        })
    }

    /// Adds a header sent with every call; `secret` ones (credentials) are marked sensitive so
    /// that they are never logged.
    pub(crate) fn with_header(
        mut self,
        name: &'static str,
        value: &str,
        secret: bool,
    ) -> Result<Self, ProviderError> {
        let mut value = HeaderValue::from_str(value).map_err(|_| {
            ProviderError::new(
                ErrorKind::InvalidRequest,
                format!("the value of header {name} contains characters not allowed in a header"),
            )
        })?;
        value.set_sensitive(secret);
        self.headers.insert(HeaderName::from_static(name), value);
        Ok(self)
    }

    pub(crate) fn api_key(&self) -> Option<&str> {
        self.api_key.as_deref()
    }

    /// `text` with every occurrence of the API key replaced.
    pub(crate) fn scrub(&self, text: &str) -> String {
        match self.api_key.as_deref() {
            Some(key) if text.contains(key) => text.replace(key, "[REDACTED]"),
            _ => text.to_string(),
        }
    }

    /// An error of `kind` whose message is scrubbed.
    pub(crate) fn error(&self, kind: ErrorKind, message: &str) -> ProviderError {
        ProviderError::new(kind, self.scrub(message))
    }

    /// An answer that could not be understood. The parser's words can quote the answer, so
    /// they go to the log only.
    pub(crate) fn malformed(&self, what: &str, err: &dyn std::fmt::Display) -> ProviderError {
        self.log_upstream(&format!("malformed {what}"), &err.to_string());
        self.error(ErrorKind::ProviderError, &format!("malformed {what}"))
    }

    /// Logs text that came from an upstream answer: scrubbed of the key and cut to
    /// [`LOGGED_UPSTREAM_CHARS`].
    pub(crate) fn log_upstream(&self, what: &str, text: &str) {
        let text = self.scrub(text);
        let mut short: String = text.chars().take(LOGGED_UPSTREAM_CHARS).collect();
        if short.len() < text.len() {
            short.push('…');
        }
        tracing::warn!(upstream = %crate::logging::escaped(&short), "provider answer: {what}");
    }

    /// A connection that failed (connecting, sending, reading the answer).
    pub(crate) fn transport_error(&self, err: &dyn std::error::Error) -> ProviderError {
        self.error(ErrorKind::Network, &crate::net::fetch::error_chain(err))
    }

    /// Runs one call under the provider's timeout (the whole call, answer body included) and
    /// the caller's cancellation; whichever ends it first drops `work` (closing its
    /// connection).
    pub(crate) async fn run<T>(
        &self,
        cancel: &CancellationToken,
        work: impl Future<Output = Result<T, ProviderError>>,
    ) -> Result<T, ProviderError> {
        let timeout = self.timeout;
        let deadline = async move {
            if timeout.is_zero() {
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(timeout).await;
        };
        tokio::select! {
            biased;
            () = cancel.cancelled() => Err(ProviderError::new(ErrorKind::Cancelled, "the call was cancelled")),
            result = work => result,
            () = deadline => Err(ProviderError::new(
                ErrorKind::Timeout,
                format!("timed out after {timeout:?}"),
            )),
        }
    }

    /// POSTs `body` as JSON to `uri` with the provider's headers; a non-2xx answer becomes an
    /// error carrying its status, the message from its body and its Retry-After.
    pub(crate) async fn post_json<B: serde::Serialize + ?Sized>(
        &self,
        uri: &Uri,
        body: &B,
    ) -> Result<Answer, ProviderError> {
        let body = serde_json::to_vec(body)
            .map_err(|e| self.error(ErrorKind::InvalidRequest, &e.to_string()))?;
        let mut request = http::Request::new(Full::new(Bytes::from(body)));
        *request.method_mut() = http::Method::POST;
        *request.uri_mut() = uri.clone();
        *request.headers_mut() = self.headers.clone();
        let response = self
            .client
            .request(request)
            .await
            .map_err(|err| self.transport_error(&err))?;
        let (parts, body) = response.into_parts();
        if parts.status.is_success() {
            return Ok(Answer {
                headers: parts.headers,
                body,
            });
        }
        let status = parts.status;
        let retry_after = retry_after(&parts.headers);
        let body = read_limited(body).await;
        // The answer's own words go to the log only: callers (turn results, models.test)
        // must never be shown text an upstream chose.
        if let Some(detail) = error_detail(&body) {
            self.log_upstream(&format!("HTTP {}", status.as_u16()), &detail);
        }
        let message = format!(
            "HTTP {} {}",
            status.as_u16(),
            status.canonical_reason().unwrap_or("error")
        );
        let mut error = ProviderError::from_status(status.as_u16(), message);
        error.retry_after = retry_after;
        Err(error)
    }

    /// The whole body, parsed as JSON.
    pub(crate) async fn json<T: DeserializeOwned>(
        &self,
        answer: Answer,
        what: &str,
    ) -> Result<T, ProviderError> {
        let bytes = answer
            .body
            .collect()
            .await
            .map_err(|err| self.transport_error(&err))?
            .to_bytes();
        serde_json::from_slice(&bytes).map_err(|err| self.malformed(what, &err))
    }
}

/// Up to [`ERROR_BODY_LIMIT`] bytes of an error answer; a failure while reading just ends it.
async fn read_limited(mut body: Incoming) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(Ok(frame)) = body.frame().await {
        let Ok(chunk) = frame.into_data() else {
            continue;
        };
        let room = ERROR_BODY_LIMIT.saturating_sub(out.len());
        out.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if out.len() >= ERROR_BODY_LIMIT {
            break;
        }
    }
    out
}

/// Whether an answer says it is JSON.
pub(crate) fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with("application/json"))
}

/// `<base><path>` as a request URI.
pub(crate) fn endpoint(id: &str, base: &str, path: &str) -> Result<Uri, ProviderError> {
    format!("{base}{path}").parse().map_err(|err| {
        ProviderError::new(
            ErrorKind::InvalidRequest,
            format!("provider {id}: invalid base_url {base:?}: {err}"),
        )
    })
}

/// The configured base URL (or `default`), validated, without a trailing slash.
pub(crate) fn base_url(
    settings: &ProviderConnection,
    default: &str,
) -> Result<String, ProviderError> {
    let raw = settings
        .base_url
        .as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .unwrap_or(default);
    let parsed = url::Url::parse(raw).map_err(|err| {
        ProviderError::new(
            ErrorKind::InvalidRequest,
            format!("provider {}: invalid base_url {raw:?}: {err}", settings.id),
        )
    })?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(ProviderError::new(
            ErrorKind::InvalidRequest,
            format!(
                "provider {}: base_url must be http(s), got {raw:?}",
                settings.id
            ),
        ));
    }
    Ok(raw.trim_end_matches('/').to_string())
}

fn is_loopback(base_url: &str) -> bool {
    let Ok(parsed) = url::Url::parse(base_url) else {
        return false;
    };
    let loopback = |ip: IpAddr| crate::net::classify(ip) == crate::net::Class::Loopback;
    match parsed.host() {
        Some(url::Host::Domain(domain)) => crate::net::policy::is_localhost(domain),
        Some(url::Host::Ipv4(ip)) => loopback(IpAddr::V4(ip)),
        Some(url::Host::Ipv6(ip)) => loopback(IpAddr::V6(ip)),
        None => false,
    }
}

/// The server's wait hint: `retry-after-ms`, else `Retry-After` in seconds or as an HTTP date,
/// clamped to [`MAX_RETRY_WAIT`]. Any value parses without a panic: huge numbers are clamped,
/// negative ones and dates in the past mean no wait, unreadable ones are ignored.
pub(crate) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    let millis = header("retry-after-ms")
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|ms| !ms.is_nan());
    if let Some(ms) = millis {
        return Some(clamped_wait(ms / 1000.0));
    }
    let value = header("retry-after")?;
    if let Ok(secs) = value.parse::<f64>() {
        return (!secs.is_nan()).then(|| clamped_wait(secs));
    }
    let date = chrono::DateTime::parse_from_rfc2822(value).ok()?;
    let wait = date.signed_duration_since(chrono::Utc::now());
    Some(wait.to_std().unwrap_or(Duration::ZERO).min(MAX_RETRY_WAIT))
}

/// `secs` as a wait between zero and [`MAX_RETRY_WAIT`] (`Duration::from_secs_f64` panics
/// on values out of its range, so the range is checked on the float first).
fn clamped_wait(secs: f64) -> Duration {
    let max = MAX_RETRY_WAIT.as_secs_f64();
    if secs.is_nan() || secs <= 0.0 {
        Duration::ZERO
    } else if secs >= max {
        MAX_RETRY_WAIT
    } else {
        Duration::from_secs_f64(secs)
    }
}

/// The message of a JSON error answer: `error.message` (OpenAI, Anthropic), `error` as a
/// string, `message` or `detail`; the error type is added when given. A non-JSON answer is
/// quoted, shortened.
fn error_detail(body: &[u8]) -> Option<String> {
    if let Ok(json) = serde_json::from_slice::<Value>(body) {
        let text = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_string);
        let error = json.get("error");
        let message = match error {
            Some(Value::Object(obj)) => text(obj.get("message")),
            Some(Value::String(s)) => Some(s.clone()),
            _ => None,
        }
        .or_else(|| text(json.get("message")))
        .or_else(|| text(json.get("detail")));
        let kind = error
            .and_then(|e| e.get("type"))
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty());
        return match (message, kind) {
            (Some(m), Some(k)) => Some(format!("{m} ({k})")),
            (Some(m), None) => Some(m),
            (None, Some(k)) => Some(k.to_string()),
            (None, None) => None,
        };
    }
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    let mut short: String = text.chars().take(ERROR_TEXT_CHARS).collect();
    if short.len() < text.len() {
        short.push('…');
    }
    Some(short)
}

/// The arguments string a model produced: its JSON value, `{}` when empty, or the string
/// itself when it is not JSON.
pub(crate) fn parse_arguments(raw: &str) -> Value {
    if raw.trim().is_empty() {
        return Value::Object(serde_json::Map::new());
    }
    serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_string()))
}

/// A call id for a tool call the provider gave none.
pub(crate) fn new_call_id() -> String {
    format!("call_{}", uuid::Uuid::new_v4().simple())
}

/// Deserializes `null` (or a missing field, with `#[serde(default)]`) as the default value.
pub(crate) fn null_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Option::<T>::deserialize(deserializer).map(Option::unwrap_or_default)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_forms() {
        let mut h = HeaderMap::new();
        assert_eq!(retry_after(&h), None);
        h.insert("retry-after", HeaderValue::from_static("7"));
        assert_eq!(retry_after(&h), Some(Duration::from_secs(7)));
        h.insert("retry-after", HeaderValue::from_static("1.5"));
        assert_eq!(retry_after(&h), Some(Duration::from_millis(1500)));
        h.insert(
            "retry-after",
            HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
        );
        assert_eq!(retry_after(&h), Some(Duration::ZERO));
        h.insert("retry-after", HeaderValue::from_static("soon"));
        assert_eq!(retry_after(&h), None);
        h.insert("retry-after-ms", HeaderValue::from_static("250"));
        assert_eq!(retry_after(&h), Some(Duration::from_millis(250)));
    }

    #[test]
    fn retry_after_future_date() {
        let mut h = HeaderMap::new();
        let when = (chrono::Utc::now() + chrono::Duration::seconds(8)).to_rfc2822();
        h.insert("retry-after", HeaderValue::from_str(&when).unwrap());
        let wait = retry_after(&h).unwrap();
        assert!(wait > Duration::from_secs(5) && wait <= Duration::from_secs(8));
        // Far in the future: clamped.
        let when = (chrono::Utc::now() + chrono::Duration::days(400)).to_rfc2822();
        h.insert("retry-after", HeaderValue::from_str(&when).unwrap());
        assert_eq!(retry_after(&h), Some(MAX_RETRY_WAIT));
    }

    /// Values of any size or sign parse without a panic, clamped to [0, MAX_RETRY_WAIT]; the
    /// limit itself and just past it.
    #[test]
    fn retry_after_of_any_size_is_clamped() {
        let max = MAX_RETRY_WAIT.as_secs();
        let cases: Vec<(&str, String, Option<Duration>)> = vec![
            ("retry-after", max.to_string(), Some(MAX_RETRY_WAIT)),
            ("retry-after", (max + 1).to_string(), Some(MAX_RETRY_WAIT)),
            (
                "retry-after",
                format!("{}", max - 1),
                Some(Duration::from_secs(max - 1)),
            ),
            (
                "retry-after",
                "99999999999999999999999999".into(),
                Some(MAX_RETRY_WAIT),
            ),
            ("retry-after", "1e308".into(), Some(MAX_RETRY_WAIT)),
            ("retry-after", "inf".into(), Some(MAX_RETRY_WAIT)),
            ("retry-after", "-5".into(), Some(Duration::ZERO)),
            ("retry-after", "-1e308".into(), Some(Duration::ZERO)),
            ("retry-after", "NaN".into(), None),
            ("retry-after", "soon".into(), None),
            (
                "retry-after",
                "Fri, 31 Dec 9999 23:59:59 GMT".into(),
                Some(MAX_RETRY_WAIT),
            ),
            ("retry-after-ms", "1e300".into(), Some(MAX_RETRY_WAIT)),
            (
                "retry-after-ms",
                "18446744073709551616000".into(),
                Some(MAX_RETRY_WAIT),
            ),
            ("retry-after-ms", "-250".into(), Some(Duration::ZERO)),
            (
                "retry-after-ms",
                (max * 1000).to_string(),
                Some(MAX_RETRY_WAIT),
            ),
            (
                "retry-after-ms",
                (max * 1000 + 1).to_string(),
                Some(MAX_RETRY_WAIT),
            ),
            (
                "retry-after-ms",
                "1500".into(),
                Some(Duration::from_millis(1500)),
            ),
        ];
        for (name, value, expected) in cases {
            let mut h = HeaderMap::new();
            h.insert(name, HeaderValue::from_str(&value).unwrap());
            assert_eq!(retry_after(&h), expected, "{name}: {value}");
        }
    }

    #[test]
    fn error_detail_shapes() {
        let openai = br#"{"error":{"message":"Bad key","type":"invalid_request_error","code":"invalid_api_key"}}"#;
        assert_eq!(
            error_detail(openai).as_deref(),
            Some("Bad key (invalid_request_error)")
        );
        let anthropic =
            br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
        assert_eq!(
            error_detail(anthropic).as_deref(),
            Some("Overloaded (overloaded_error)")
        );
        assert_eq!(
            error_detail(br#"{"error":"model not found"}"#).as_deref(),
            Some("model not found")
        );
        assert_eq!(
            error_detail(br#"{"detail":"nope"}"#).as_deref(),
            Some("nope")
        );
        assert_eq!(
            error_detail(b"  plain text  ").as_deref(),
            Some("plain text")
        );
        assert_eq!(error_detail(b""), None);
        let long = "x".repeat(1000);
        let short = error_detail(long.as_bytes()).unwrap();
        assert_eq!(short.chars().count(), ERROR_TEXT_CHARS + 1);
    }

    #[test]
    fn arguments_parse_or_stay_strings() {
        assert_eq!(parse_arguments(r#"{"a":1}"#), serde_json::json!({"a": 1}));
        assert_eq!(parse_arguments(""), serde_json::json!({}));
        assert_eq!(parse_arguments("{oops"), Value::String("{oops".into()));
    }

    #[test]
    fn loopback_detection() {
        assert!(is_loopback("http://localhost:11434/v1"));
        assert!(is_loopback("http://127.0.0.1:8080"));
        assert!(is_loopback("http://[::1]:8080"));
        assert!(!is_loopback("https://api.openai.com/v1"));
        assert!(!is_loopback("http://10.0.0.1"));
        assert!(is_loopback("http://localhost.:8080"));
        assert!(is_loopback("http://[::ffff:127.0.0.1]:8080"));
        assert!(is_loopback("http://2130706433:8080"));
    }

    #[test]
    fn call_ids_are_unique() {
        let a = new_call_id();
        assert!(a.starts_with("call_"));
        assert_ne!(a, new_call_id());
    }
}

#[cfg(test)]
mod proxy_tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    /// Reads up to the end of a request head.
    async fn head(stream: &mut TcpStream) -> String {
        let mut buf = Vec::new();
        let mut byte = [0u8; 1];
        while !buf.ends_with(b"\r\n\r\n") {
            if stream.read(&mut byte).await.unwrap() == 0 {
                break;
            }
            buf.push(byte[0]);
        }
        String::from_utf8(buf).unwrap()
    }

    /// A server answering one JSON request; returns its port and the request head it saw.
    async fn upstream() -> (u16, tokio::task::JoinHandle<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let head = head(&mut s).await;
            let body = r#"{"ok":true}"#;
            let answer = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
            s.write_all(answer.as_bytes()).await.unwrap();
            head
        });
        (port, task)
    }

    /// An HTTP CONNECT proxy that tunnels any host to `127.0.0.1`; returns its port and the
    /// CONNECT head it saw.
    async fn connect_proxy() -> (u16, tokio::task::JoinHandle<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            let (mut client, _) = listener.accept().await.unwrap();
            let head = head(&mut client).await;
            let target = head.split_whitespace().nth(1).unwrap().to_owned();
            let target_port = target.rsplit(':').next().unwrap().to_owned();
            let mut server = TcpStream::connect(format!("127.0.0.1:{target_port}"))
                .await
                .unwrap();
            client
                .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                .await
                .unwrap();
            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
            head
        });
        (port, task)
    }

    fn settings() -> ProviderConnection {
        ProviderConnection {
            address_guard: None,
            id: "p".into(),
            kind: super::super::ProviderKind::Openai,
            base_url: None,
            api_key: Some("sk-test-key".into()),
            api_key_env: None,
            timeout: Duration::from_secs(5),
        }
    }

    #[tokio::test]
    async fn calls_go_through_the_proxy_by_connect_with_its_credentials() {
        let (up_port, up) = upstream().await;
        let (proxy_port, proxy) = connect_proxy().await;
        let matcher = Matcher::builder()
            .all(format!("http://user:secret@127.0.0.1:{proxy_port}"))
            .build();
        let http = Http::with_network(&settings(), Some(matcher), tls_config(None))
            .unwrap()
            .with_header("authorization", "Bearer sk-test-key", true)
            .unwrap();
        // A name only the proxy resolves: the gateway never looks it up itself.
        let uri = endpoint(
            "p",
            &format!("http://models.example.test:{up_port}"),
            "/v1/x",
        )
        .unwrap();
        let cancel = CancellationToken::new();
        let answer: Value = http
            .run(&cancel, async {
                let a = http.post_json(&uri, &serde_json::json!({"q": 1})).await?;
                http.json(a, "answer").await
            })
            .await
            .unwrap();
        assert_eq!(answer, serde_json::json!({"ok": true}));
        let connect = proxy.await.unwrap();
        assert!(
            connect.starts_with(&format!(
                "CONNECT models.example.test:{up_port} HTTP/1.1\r\n"
            )),
            "{connect}"
        );
        // user:secret, base64
        assert!(
            connect
                .to_ascii_lowercase()
                .contains("proxy-authorization: basic dxnlcjpzzwnyzxq="),
            "{connect}"
        );
        let request = up.await.unwrap();
        assert!(request.starts_with("POST /v1/x HTTP/1.1\r\n"), "{request}");
        let lower = request.to_ascii_lowercase();
        assert!(lower.contains("authorization: bearer sk-test-key"));
        assert!(lower.contains("content-type: application/json"));
        assert!(!lower.contains("proxy-authorization"), "{request}");
    }

    #[tokio::test]
    async fn a_loopback_base_url_never_uses_a_proxy() {
        // Whatever proxy the environment names, a loopback base URL is called directly.
        let (up_port, up) = upstream().await;
        let base = format!("http://127.0.0.1:{up_port}");
        assert!(is_loopback(&base));
        let http = Http::new(&settings(), &base).unwrap();
        let uri = endpoint("p", &base, "/v1/x").unwrap();
        let a = http.post_json(&uri, &serde_json::json!({})).await.unwrap();
        let v: Value = http.json(a, "answer").await.unwrap();
        assert_eq!(v, serde_json::json!({"ok": true}));
        assert!(up.await.unwrap().starts_with("POST /v1/x"));
    }

    #[tokio::test]
    async fn the_deadline_covers_the_whole_call() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        // Accepts and never answers.
        let _hold = tokio::spawn(async move {
            let (s, _) = listener.accept().await.unwrap();
            tokio::time::sleep(Duration::from_secs(30)).await;
            drop(s);
        });
        let mut s = settings();
        s.timeout = Duration::from_millis(200);
        let base = format!("http://127.0.0.1:{port}");
        let http = Http::new(&s, &base).unwrap();
        let uri = endpoint("p", &base, "/x").unwrap();
        let started = std::time::Instant::now();
        let err = http
            .run(&CancellationToken::new(), async {
                http.post_json(&uri, &serde_json::json!({})).await.map(drop)
            })
            .await
            .unwrap_err();
        assert_eq!(err.kind, ErrorKind::Timeout);
        assert!(
            err.message.contains("timed out after 200ms"),
            "{}",
            err.message
        );
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn a_header_value_that_cannot_be_sent_is_refused() {
        let http = Http::with_network(&settings(), None, tls_config(None)).unwrap();
        let err = http
            .with_header("x-api-key", "bad\nvalue", true)
            .map(drop)
            .unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidRequest);
        assert!(!err.message.contains("bad"));
    }
}

/// HTTPS to a provider, against a TLS server on loopback whose certificate (for `localhost`
/// and 127.0.0.1) is signed by a test-only CA (`testdata/`: made for these tests with openssl,
/// valid until 2126; the key protects nothing else).
#[cfg(test)]
mod tls_tests {
    use super::*;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    use std::path::Path;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    const CA: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/gateway/src/providers/testdata/ca.pem"
    );
    const SERVER_CERT: &[u8] = include_bytes!("testdata/server.pem");
    const SERVER_KEY: &[u8] = include_bytes!("testdata/server.key");

    /// A TLS server answering one JSON request (or failing the handshake); returns its port.
    async fn tls_upstream() -> u16 {
        let certs = CertificateDer::pem_slice_iter(SERVER_CERT)
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_slice(SERVER_KEY).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            let Ok(mut tls) = acceptor.accept(tcp).await else {
                return;
            };
            let mut buf = Vec::new();
            let mut chunk = [0u8; 1024];
            while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                match tls.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            let body = r#"{"secure":true}"#;
            let answer = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
            let _ = tls.write_all(answer.as_bytes()).await;
            let _ = tls.shutdown().await;
        });
        port
    }

    fn settings() -> ProviderConnection {
        ProviderConnection {
            address_guard: None,
            id: "p".into(),
            kind: super::super::ProviderKind::Openai,
            base_url: None,
            api_key: None,
            api_key_env: None,
            timeout: Duration::from_secs(5),
        }
    }

    async fn call(http: &Http, port: u16) -> Result<Value, ProviderError> {
        let uri = endpoint("p", &format!("https://localhost:{port}"), "/v1/x").unwrap();
        http.run(&CancellationToken::new(), async {
            let a = http.post_json(&uri, &serde_json::json!({"q": 1})).await?;
            http.json(a, "answer").await
        })
        .await
    }

    #[tokio::test]
    async fn a_server_signed_by_an_extra_root_is_trusted() {
        let port = tls_upstream().await;
        let http = Http::with_network(&settings(), None, tls_config(Some(Path::new(CA)))).unwrap();
        assert_eq!(
            call(&http, port).await.unwrap(),
            serde_json::json!({"secure": true})
        );
    }

    #[tokio::test]
    async fn without_the_extra_root_the_certificate_is_refused() {
        let port = tls_upstream().await;
        let http = Http::with_network(&settings(), None, tls_config(None)).unwrap();
        let err = call(&http, port).await.unwrap_err();
        assert_eq!(err.kind, ErrorKind::Network);
        assert!(err.message.contains("certificate"), "{}", err.message);
    }

    #[test]
    fn an_unusable_roots_file_is_an_error_naming_the_variable() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        for path in [missing, empty] {
            let err = Http::with_network(&settings(), None, tls_config(Some(&path)))
                .err()
                .expect("refused");
            assert_eq!(err.kind, ErrorKind::Unavailable);
            assert!(
                err.message
                    .contains(&format!("SSL_CERT_FILE={}", path.display())),
                "{}",
                err.message
            );
        }
    }
}
