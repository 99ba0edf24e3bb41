//! Retries with exponential backoff and a timeout per attempt, around single provider
//! attempts. A streaming call is retried only while it has not sent any delta yet (a caller
//! must never see text twice).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{ChatRequest, ChatResponse, DeltaSink, ErrorKind, Provider, ProviderError};

/// How a provider's calls are retried.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Retries after the first attempt.
    pub max_retries: u32,
    /// Timeout of each attempt.
    pub timeout: Duration,
    /// First backoff; doubled per retry, with jitter, capped at `max_backoff`.
    pub base_backoff: Duration,
    pub max_backoff: Duration,
}

impl RetryPolicy {
    pub fn new(max_retries: u32, timeout: Duration) -> Self {
        Self {
            max_retries,
            timeout,
            base_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(10),
        }
    }

    fn backoff(&self, attempt: u32, err: &ProviderError) -> Duration {
        if let Some(wait) = err.retry_after {
            return wait.min(self.max_backoff);
        }
        let exp = self
            .base_backoff
            .saturating_mul(1u32 << attempt.min(16))
            .min(self.max_backoff);
        // Full jitter between half and all of the exponential delay.
        let half = exp / 2;
        half + Duration::from_millis(fastrand::u64(0..=half.as_millis() as u64))
    }
}

/// One chat call with retries. Returns the result and how many attempts were made.
pub async fn chat_with_retry(
    provider: &dyn Provider,
    req: &ChatRequest,
    sink: Option<&DeltaSink>,
    policy: RetryPolicy,
    cancel: &CancellationToken,
) -> (Result<ChatResponse, ProviderError>, u32) {
    let mut attempt = 0;
    loop {
        attempt += 1;
        // Forward deltas through a relay so we know whether any reached the caller.
        let sent = Arc::new(AtomicBool::new(false));
        let (relay, forward) = match sink {
            Some(out) => {
                let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
                let out = out.clone();
                let sent = sent.clone();
                let task = tokio::spawn(async move {
                    while let Some(d) = rx.recv().await {
                        sent.store(true, Ordering::SeqCst);
                        let _ = out.send(d);
                    }
                });
                (Some(tx), Some(task))
            }
            None => (None, None),
        };
        let result = tokio::select! {
            r = tokio::time::timeout(policy.timeout, provider.chat(req, relay.as_ref(), cancel)) => match r {
                Ok(r) => r,
                Err(_) => Err(ProviderError::new(
                    ErrorKind::Timeout,
                    format!("no answer within {} ms", policy.timeout.as_millis()),
                )),
            },
            () = cancel.cancelled() => Err(ProviderError::new(ErrorKind::Cancelled, "cancelled")),
        };
        drop(relay);
        if let Some(task) = forward {
            let _ = task.await;
        }
        match result {
            Ok(r) => return (Ok(r), attempt),
            Err(e) => {
                let again = e.retryable()
                    && attempt <= policy.max_retries
                    && !sent.load(Ordering::SeqCst)
                    && !cancel.is_cancelled();
                if !again {
                    return (Err(e), attempt);
                }
                let wait = policy.backoff(attempt - 1, &e);
                tracing::warn!(
                    kind = e.kind.as_str(),
                    attempt,
                    wait_ms = wait.as_millis() as u64,
                    "model call failed, retrying"
                );
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    () = cancel.cancelled() => {
                        return (Err(ProviderError::new(ErrorKind::Cancelled, "cancelled")), attempt);
                    }
                }
            }
        }
    }
}
