//! HTTP limits: the global rate limiter (per client address, fixed window) and the POST body
//! reader that counts bytes actually read (chunked bodies too) under a read deadline.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;

/// Paths that the rate limit never counts.
pub const RATE_EXEMPT: &[&str] = &["/health", "/api/health"];

/// Fixed-window request counter per client address.
pub struct RateLimiter {
    window: Duration,
    max: u64,
    windows: Mutex<HashMap<IpAddr, (Instant, u64)>>,
}

/// A refused request: how long until the window resets.
pub struct Limited {
    pub retry_after: Duration,
}

impl RateLimiter {
    pub fn new(window: Duration, max: u64) -> Self {
        Self {
            window,
            max,
            windows: Mutex::new(HashMap::new()),
        }
    }

    /// Counts one request from `ip`; refused requests are not counted.
    pub fn check(&self, ip: IpAddr, now: Instant) -> Result<(), Limited> {
        let Ok(mut windows) = self.windows.lock() else {
            return Ok(());
        };
        if windows.len() > 10_000 {
            let window = self.window;
            windows.retain(|_, (start, _)| now.duration_since(*start) < window);
        }
        let entry = windows.entry(ip).or_insert((now, 0));
        if now.duration_since(entry.0) >= self.window {
            *entry = (now, 0);
        }
        if entry.1 >= self.max {
            return Err(Limited {
                retry_after: self.window.saturating_sub(now.duration_since(entry.0)),
            });
        }
        entry.1 += 1;
        Ok(())
    }
}

/// Why a body could not be read.
#[derive(Debug, PartialEq, Eq)]
pub enum BodyError {
    /// More than the limit was sent (or announced in Content-Length).
    TooLarge,
    /// The client did not finish sending in time.
    Timeout,
    /// The connection failed mid-body.
    Io,
}

/// Reads a body under the gateway's limits (`httpBodyLimitBytes`, `bodyReadTimeoutMs`).
pub async fn read_gateway_body(
    req: &poem::Request,
    body: poem::Body,
    g: &crate::config::GatewayConfig,
) -> Result<Bytes, BodyError> {
    read_body(
        req,
        body,
        g.http_body_limit_bytes,
        Duration::from_millis(g.body_read_timeout_ms),
    )
    .await
}

/// Reads a request body, refusing it as soon as more than `limit` bytes have arrived (or are
/// announced), and giving up after `deadline`.
pub async fn read_body(
    req: &poem::Request,
    body: poem::Body,
    limit: u64,
    deadline: Duration,
) -> Result<Bytes, BodyError> {
    let announced = req
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if announced.is_some_and(|n| n > limit) {
        return Err(BodyError::TooLarge);
    }
    let read = async move {
        let mut stream = std::pin::pin!(body.into_bytes_stream());
        let mut buf = BytesMut::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|_| BodyError::Io)?;
            if (buf.len() + chunk.len()) as u64 > limit {
                return Err(BodyError::TooLarge);
            }
            buf.extend_from_slice(&chunk);
        }
        Ok(buf.freeze())
    };
    tokio::time::timeout(deadline, read)
        .await
        .unwrap_or(Err(BodyError::Timeout))
}
