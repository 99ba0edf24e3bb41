//! Retries with exponential backoff and a timeout per attempt, around single provider
//! attempts. A streaming call is retried only while it has not sent any delta yet (a caller
//! must never see text twice).

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{ChatRequest, ChatResponse, DeltaSink, ErrorKind, Provider, ProviderError};

/// The longest wait between two attempts, whatever the server's `Retry-After` says (a
/// provider's own `timeoutMs` bounds it further).
pub const MAX_RETRY_WAIT: Duration = Duration::from_secs(10);

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
            max_backoff: MAX_RETRY_WAIT,
        }
    }

    /// The wait before retry number `attempt + 1`: the server's hint when it gave one, else
    /// exponential with jitter; never longer than `max_backoff` nor than one attempt's timeout
    /// (waiting longer than a call may take is not worth it to the caller).
    fn backoff(&self, attempt: u32, err: &ProviderError) -> Duration {
        let cap = self.max_backoff.min(self.timeout);
        if let Some(wait) = err.retry_after {
            return wait.min(cap);
        }
        let exp = self
            .base_backoff
            .saturating_mul(1u32 << attempt.min(16))
            .min(cap);
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
        // A fresh sink per attempt: it tells whether this attempt's deltas reached the caller.
        let attempt_sink = sink.map(DeltaSink::attempt);
        let call = provider.chat(req, attempt_sink.as_ref(), cancel);
        let result = if provider.bounds_its_calls() {
            call.await
        } else {
            bounded(call, policy.timeout, cancel).await
        };
        let sent = attempt_sink.as_ref().is_some_and(DeltaSink::sent_any);
        match result {
            Ok(r) => return (Ok(r), attempt),
            Err(e) => {
                let again = e.retryable()
                    && attempt <= policy.max_retries
                    && !sent
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

/// `call` ended at `timeout` or when `cancel` fires, for providers that do neither themselves.
async fn bounded(
    call: impl std::future::Future<Output = Result<ChatResponse, ProviderError>>,
    timeout: Duration,
    cancel: &CancellationToken,
) -> Result<ChatResponse, ProviderError> {
    tokio::select! {
        r = tokio::time::timeout(timeout, call) => r.unwrap_or_else(|_| Err(ProviderError::new(
            ErrorKind::Timeout,
            format!("no answer within {} ms", timeout.as_millis()),
        ))),
        () = cancel.cancelled() => Err(ProviderError::new(ErrorKind::Cancelled, "cancelled")),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::super::{BoxFuture, Embeddings, StopReason, Usage};
    use super::*;

    /// Fails its first `fail` attempts with a retryable error, sending `delta` first when set;
    /// then answers "ok". Each attempt first waits `delay`; `bounds` is what it says of its
    /// own deadline.
    struct Flaky {
        fail: u32,
        delta_before_failing: bool,
        calls: AtomicU32,
        delay: Duration,
        bounds: bool,
    }

    fn flaky(fail: u32, delta_before_failing: bool) -> Flaky {
        Flaky {
            fail,
            delta_before_failing,
            calls: AtomicU32::new(0),
            delay: Duration::ZERO,
            bounds: false,
        }
    }

    impl Provider for Flaky {
        fn chat<'a>(
            &'a self,
            _req: &'a ChatRequest,
            sink: Option<&'a DeltaSink>,
            _cancel: &'a CancellationToken,
        ) -> BoxFuture<'a, Result<ChatResponse, ProviderError>> {
            Box::pin(async move {
                tokio::time::sleep(self.delay).await;
                let n = self.calls.fetch_add(1, Ordering::SeqCst);
                if n < self.fail {
                    if self.delta_before_failing {
                        if let Some(s) = sink {
                            let _ = s.send("partial".into());
                        }
                    }
                    return Err(ProviderError::new(ErrorKind::Network, "reset"));
                }
                if let Some(s) = sink {
                    let _ = s.send("ok".into());
                }
                Ok(ChatResponse {
                    content: "ok".into(),
                    tool_calls: Vec::new(),
                    usage: Usage::default(),
                    stop: StopReason::Stop,
                })
            })
        }

        fn bounds_its_calls(&self) -> bool {
            self.bounds
        }

        fn embed<'a>(
            &'a self,
            _model: &'a str,
            _inputs: &'a [String],
            _cancel: &'a CancellationToken,
        ) -> BoxFuture<'a, Result<Embeddings, ProviderError>> {
            Box::pin(async { Err(ProviderError::new(ErrorKind::InvalidRequest, "no")) })
        }
    }

    fn request() -> ChatRequest {
        ChatRequest {
            model: "m".into(),
            system: None,
            messages: Vec::new(),
            tools: Vec::new(),
            max_tokens: None,
            temperature: None,
        }
    }

    fn policy() -> RetryPolicy {
        RetryPolicy {
            base_backoff: Duration::from_millis(1),
            ..RetryPolicy::new(2, Duration::from_secs(5))
        }
    }

    async fn run(p: &Flaky) -> (Result<ChatResponse, ProviderError>, u32, Vec<String>) {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let sink = DeltaSink::new(tx);
        let (result, attempts) = chat_with_retry(
            p,
            &request(),
            Some(&sink),
            policy(),
            &CancellationToken::new(),
        )
        .await;
        drop(sink);
        let mut deltas = Vec::new();
        while let Some(d) = rx.recv().await {
            deltas.push(d);
        }
        (result, attempts, deltas)
    }

    #[tokio::test]
    async fn a_stream_that_failed_before_its_first_delta_is_retried() {
        let p = flaky(2, false);
        let (result, attempts, deltas) = run(&p).await;
        assert_eq!(result.unwrap().content, "ok");
        assert_eq!(attempts, 3);
        assert_eq!(deltas, ["ok"]);
    }

    #[tokio::test]
    async fn a_stream_that_sent_text_is_never_retried() {
        let p = flaky(1, true);
        let (result, attempts, deltas) = run(&p).await;
        assert_eq!(result.unwrap_err().kind, ErrorKind::Network);
        assert_eq!(attempts, 1);
        assert_eq!(deltas, ["partial"]);
    }

    #[tokio::test]
    async fn the_timeout_and_cancellation_apply_only_to_providers_that_do_not_bound_their_calls() {
        let policy = RetryPolicy::new(0, Duration::from_millis(50));
        let call = |bounds, cancel: CancellationToken| async move {
            let p = Flaky {
                delay: Duration::from_millis(250),
                bounds,
                ..flaky(0, false)
            };
            chat_with_retry(&p, &request(), None, policy, &cancel)
                .await
                .0
        };
        let err = call(false, CancellationToken::new()).await.unwrap_err();
        assert_eq!(err.kind, ErrorKind::Timeout);
        assert_eq!(err.message, "no answer within 50 ms");

        let cancelled = CancellationToken::new();
        cancelled.cancel();
        let err = call(false, cancelled).await.unwrap_err();
        assert_eq!(err.kind, ErrorKind::Cancelled);

        // One that bounds its own calls is left to do so (here: it answers after the policy's
        // timeout, and nothing cut it short).
        assert_eq!(
            call(true, CancellationToken::new()).await.unwrap().content,
            "ok"
        );
    }
}
