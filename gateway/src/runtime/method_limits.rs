//! Per-method rate limits (across server generations): `env.set` at most 5 calls and
//! `env.list` at most 30 calls per minute gateway-wide, as the spec sets; `scheduler.wake` at
//! most 6 calls per minute per caller (designed: every wake may cost a model turn). governor's
//! GCRA: the full burst at once, then one call per 12 s, 2 s and 10 s.

use std::num::NonZeroU32;

use governor::{DefaultDirectRateLimiter, DefaultKeyedRateLimiter, Quota, RateLimiter};

use crate::api::error::GatewayError;

/// `env.set` calls per minute.
pub const ENV_SET_PER_MINUTE: u32 = 5;
/// `env.list` calls per minute.
pub const ENV_LIST_PER_MINUTE: u32 = 30;
/// `scheduler.wake` calls per minute, per caller (token client id).
pub const SCHEDULER_WAKE_PER_MINUTE: u32 = 6;
/// Callers kept by a keyed limiter before the ones back at a full burst are forgotten.
const MAX_TRACKED_CALLERS: usize = 1024;

pub struct MethodLimits {
    env_set: DefaultDirectRateLimiter,
    env_list: DefaultDirectRateLimiter,
    scheduler_wake: DefaultKeyedRateLimiter<String>,
}

fn quota(n: u32) -> Quota {
    Quota::per_minute(NonZeroU32::new(n).unwrap_or(NonZeroU32::MIN))
}

fn per_minute(n: u32) -> DefaultDirectRateLimiter {
    RateLimiter::direct(quota(n))
}

fn refused(method: &str, n: u32, per: &str) -> GatewayError {
    crate::metrics::rate_limited(crate::metrics::Limiter::RpcMethod);
    GatewayError::RateLimited(format!(
        "Rate limit exceeded: {method} allows {n} calls per minute{per}"
    ))
}

fn check(l: &DefaultDirectRateLimiter, method: &str, n: u32) -> Result<(), GatewayError> {
    l.check().map_err(|_| refused(method, n, ""))
}

impl Default for MethodLimits {
    fn default() -> Self {
        Self {
            env_set: per_minute(ENV_SET_PER_MINUTE),
            env_list: per_minute(ENV_LIST_PER_MINUTE),
            scheduler_wake: RateLimiter::keyed(quota(SCHEDULER_WAKE_PER_MINUTE)),
        }
    }
}

impl MethodLimits {
    pub fn env_set(&self) -> Result<(), GatewayError> {
        check(&self.env_set, "env.set", ENV_SET_PER_MINUTE)
    }

    pub fn env_list(&self) -> Result<(), GatewayError> {
        check(&self.env_list, "env.list", ENV_LIST_PER_MINUTE)
    }

    /// One `scheduler.wake` by `caller` (its client id): each caller has its own budget, so
    /// one token cannot use up another's.
    pub fn scheduler_wake(&self, caller: &str) -> Result<(), GatewayError> {
        let l = &self.scheduler_wake;
        // Bounded memory whatever the number of callers: a caller whose budget is whole again
        // is the same as one never seen.
        if l.len() > MAX_TRACKED_CALLERS {
            l.retain_recent();
        }
        l.check_key(&caller.to_owned())
            .map_err(|_| refused("scheduler.wake", SCHEDULER_WAKE_PER_MINUTE, " per caller"))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn scheduler_wake_is_limited_per_caller() {
        let limits = MethodLimits::default();
        for _ in 0..SCHEDULER_WAKE_PER_MINUTE {
            limits.scheduler_wake("alice").unwrap();
        }
        match limits.scheduler_wake("alice") {
            Err(GatewayError::RateLimited(m)) => assert!(m.contains("scheduler.wake"), "{m}"),
            other => panic!("expected the limit, got {other:?}"),
        }
        // Another caller's budget is untouched.
        limits.scheduler_wake("bob").unwrap();
    }
}
