//! Per-method rate limits the spec sets (gateway-wide, across server generations): `env.set`
//! at most 5 calls and `env.list` at most 30 calls per minute (governor's GCRA: the full burst
//! at once, then one call per 12 s and per 2 s).

use std::num::NonZeroU32;

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};

use crate::error::GatewayError;

/// `env.set` calls per minute.
pub const ENV_SET_PER_MINUTE: u32 = 5;
/// `env.list` calls per minute.
pub const ENV_LIST_PER_MINUTE: u32 = 30;

pub struct MethodLimits {
    env_set: DefaultDirectRateLimiter,
    env_list: DefaultDirectRateLimiter,
}

fn per_minute(n: u32) -> DefaultDirectRateLimiter {
    RateLimiter::direct(Quota::per_minute(
        NonZeroU32::new(n).unwrap_or(NonZeroU32::MIN),
    ))
}

fn check(l: &DefaultDirectRateLimiter, method: &str, n: u32) -> Result<(), GatewayError> {
    l.check().map_err(|_| {
        crate::obs::metrics::rate_limited(crate::obs::metrics::Limiter::RpcMethod);
        GatewayError::RateLimited(format!(
            "Rate limit exceeded: {method} allows {n} calls per minute"
        ))
    })
}

impl Default for MethodLimits {
    fn default() -> Self {
        Self {
            env_set: per_minute(ENV_SET_PER_MINUTE),
            env_list: per_minute(ENV_LIST_PER_MINUTE),
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
}
