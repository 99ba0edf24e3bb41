//! HTTP plumbing shared by the remote providers (openai, anthropic): the pooled client, sending
//! under cancellation, mapping transport failures and error answers to [`ProviderError`]
//! (with Retry-After), and keeping the API key out of every error message.

use std::future::Future;
use std::net::IpAddr;
use std::time::Duration;

use futures_util::StreamExt;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::{ErrorKind, ProviderError, ProviderSettings};

/// Longest wait for a TCP/TLS connection (capped by the call timeout).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Idle pooled connections are closed after this.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// At most this much of an error answer is read (to find its message).
const ERROR_BODY_LIMIT: usize = 64 * 1024;
/// An error answer that is not JSON is quoted up to this many characters.
const ERROR_TEXT_CHARS: usize = 300;

/// The client and credentials of one provider instance.
pub(crate) struct Http {
    client: reqwest::Client,
    api_key: Option<String>,
    timeout: Duration,
}

impl Http {
    /// Builds the pooled client for `base_url` (already validated by [`base_url`]).
    pub(crate) fn new(settings: &ProviderSettings, base_url: &str) -> Result<Self, ProviderError> {
        let timeout = settings.timeout;
        let mut builder = reqwest::Client::builder()
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .tcp_keepalive(Duration::from_secs(60))
            // A redirect could carry the key header to another host; API endpoints never need one.
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("agent-gateway/", env!("CARGO_PKG_VERSION")));
        if timeout.is_zero() {
            builder = builder.connect_timeout(CONNECT_TIMEOUT);
        } else {
            builder = builder
                .connect_timeout(CONNECT_TIMEOUT.min(timeout))
                .timeout(timeout);
        }
        if is_loopback(base_url) {
            // A local model server is never reached through an HTTP(S)_PROXY.
            builder = builder.no_proxy();
        }
        let client = builder.build().map_err(|err| {
            ProviderError::new(
                ErrorKind::Unavailable,
                format!("cannot build the HTTP client: {}", error_chain(&err)),
            )
        })?;
        Ok(Self {
            client,
            api_key: settings.api_key.clone().filter(|k| !k.is_empty()),
            timeout,
        })
    }

    pub(crate) fn client(&self) -> &reqwest::Client {
        &self.client
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

    /// An answer that could not be understood.
    pub(crate) fn malformed(&self, what: &str, err: &dyn std::fmt::Display) -> ProviderError {
        self.error(
            ErrorKind::ProviderError,
            &format!("malformed {what}: {err}"),
        )
    }

    /// Maps a reqwest failure (connecting, sending, reading the body) to a provider error.
    pub(crate) fn transport_error(&self, err: &reqwest::Error) -> ProviderError {
        let kind = if err.is_timeout() {
            ErrorKind::Timeout
        } else if err.is_builder() {
            ErrorKind::InvalidRequest
        } else {
            // connect, request and body errors: unreachable or the connection broke (reqwest
            // reports a broken body as a "decode" error; bodies are never decoded by it here)
            ErrorKind::Network
        };
        let detail = error_chain(err);
        let message = match kind {
            ErrorKind::Timeout if !self.timeout.is_zero() => {
                format!("timed out after {:?}: {detail}", self.timeout)
            }
            _ => detail,
        };
        self.error(kind, &message)
    }

    /// Sends the request; a non-2xx answer becomes an error carrying its status, the
    /// message from its body and its Retry-After.
    pub(crate) async fn send(
        &self,
        request: reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, ProviderError> {
        let response = request
            .send()
            .await
            .map_err(|err| self.transport_error(&err))?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let retry_after = retry_after(response.headers());
        let body = self.read_limited(response).await;
        let detail = error_detail(&body).unwrap_or_else(|| {
            status
                .canonical_reason()
                .unwrap_or("no error message")
                .to_string()
        });
        let message = self.scrub(&format!("HTTP {}: {detail}", status.as_u16()));
        let mut error = ProviderError::from_status(status.as_u16(), message);
        error.retry_after = retry_after;
        Err(error)
    }

    /// The whole body, parsed as JSON.
    pub(crate) async fn json<T: DeserializeOwned>(
        &self,
        response: reqwest::Response,
        what: &str,
    ) -> Result<T, ProviderError> {
        let bytes = response
            .bytes()
            .await
            .map_err(|err| self.transport_error(&err))?;
        serde_json::from_slice(&bytes).map_err(|err| self.malformed(what, &err))
    }

    /// Up to [`ERROR_BODY_LIMIT`] bytes of an error answer; a failure while reading just ends it.
    async fn read_limited(&self, response: reqwest::Response) -> Vec<u8> {
        let mut body = Vec::new();
        let mut stream = response.bytes_stream();
        while let Some(Ok(chunk)) = stream.next().await {
            let room = ERROR_BODY_LIMIT.saturating_sub(body.len());
            body.extend_from_slice(&chunk[..chunk.len().min(room)]);
            if body.len() >= ERROR_BODY_LIMIT {
                break;
            }
        }
        body
    }
}

/// Runs `work` unless `cancel` fires first; then `work` is dropped (closing its connection)
/// and the call ends as Cancelled.
pub(crate) async fn with_cancel<T>(
    cancel: &CancellationToken,
    work: impl Future<Output = Result<T, ProviderError>>,
) -> Result<T, ProviderError> {
    tokio::select! {
        biased;
        () = cancel.cancelled() => Err(ProviderError::new(ErrorKind::Cancelled, "the call was cancelled")),
        result = work => result,
    }
}

/// The configured base URL (or `default`), validated, without a trailing slash.
pub(crate) fn base_url(
    settings: &ProviderSettings,
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
    match parsed.host() {
        Some(url::Host::Domain(domain)) => {
            domain.eq_ignore_ascii_case("localhost") || domain.ends_with(".localhost")
        }
        Some(url::Host::Ipv4(ip)) => IpAddr::V4(ip).is_loopback(),
        Some(url::Host::Ipv6(ip)) => IpAddr::V6(ip).is_loopback(),
        None => false,
    }
}

/// A reqwest error and its sources, joined (reqwest's own text omits the cause).
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

/// The server's wait hint: `retry-after-ms`, else `Retry-After` in seconds or as an HTTP date.
pub(crate) fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    if let Some(ms) = header("retry-after-ms").and_then(|v| v.parse::<f64>().ok()) {
        if ms.is_finite() && ms >= 0.0 {
            return Some(Duration::from_secs_f64(ms / 1000.0));
        }
    }
    let value = header("retry-after")?;
    if let Ok(secs) = value.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs));
    }
    let date = chrono::DateTime::parse_from_rfc2822(value).ok()?;
    let wait = date.signed_duration_since(chrono::Utc::now());
    Some(wait.to_std().unwrap_or(Duration::ZERO))
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
    use reqwest::header::{HeaderMap, HeaderValue};

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
        let when = (chrono::Utc::now() + chrono::Duration::seconds(120)).to_rfc2822();
        h.insert("retry-after", HeaderValue::from_str(&when).unwrap());
        let wait = retry_after(&h).unwrap();
        assert!(wait > Duration::from_secs(100) && wait <= Duration::from_secs(120));
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
    }

    #[test]
    fn call_ids_are_unique() {
        let a = new_call_id();
        assert!(a.starts_with("call_"));
        assert_ne!(a, new_call_id());
    }
}
