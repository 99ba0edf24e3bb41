//! Cancellation tokens watched from inside a task's own poll loop (a connection's): a
//! `select!` over `token.cancelled()` polls the token's future at every wake-up of the task,
//! and each poll takes the token's waiter lock. Here the future is polled only to register the
//! task's waker (once, and again if the waker changes); every other wake-up reads the flag.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Waker};

use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

/// One token, watched by one task.
pub struct Watched {
    token: CancellationToken,
    cancelled: Pin<Box<WaitForCancellationFutureOwned>>,
    registered: Option<Waker>,
}

impl Watched {
    pub fn new(token: &CancellationToken) -> Self {
        Self {
            token: token.clone(),
            cancelled: Box::pin(token.clone().cancelled_owned()),
            registered: None,
        }
    }

    /// Whether the token is cancelled. When it is not, the task polling with `cx` is woken when
    /// it is (the waker is registered unless it already is).
    pub fn fired(&mut self, cx: &mut Context<'_>) -> bool {
        if self.token.is_cancelled() {
            return true;
        }
        if self
            .registered
            .as_ref()
            .is_none_or(|w| !w.will_wake(cx.waker()))
        {
            if self.cancelled.as_mut().poll(cx).is_ready() {
                return true;
            }
            self.registered = Some(cx.waker().clone());
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::poll_fn;
    use std::task::Poll;
    use std::time::Duration;

    #[tokio::test]
    async fn a_watching_task_wakes_when_the_token_is_cancelled_later() {
        let token = CancellationToken::new();
        let mut watched = Watched::new(&token);
        let waiter = tokio::spawn(poll_fn(move |cx| {
            if watched.fired(cx) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        }));
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished());
        token.cancel();
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("woken by the cancellation")
            .expect("no panic");
    }

    #[tokio::test]
    async fn a_token_cancelled_before_the_first_poll_has_fired() {
        let token = CancellationToken::new();
        token.cancel();
        let mut watched = Watched::new(&token);
        poll_fn(|cx| Poll::Ready(watched.fired(cx)))
            .await
            .then_some(())
            .expect("fired");
    }
}
