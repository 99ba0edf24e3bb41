//! `net`: what the gateway's own outbound fetches (`net::fetch`) may reach: the address classes
//! and CIDRs opened beyond the public internet, and the limits of one fetch. Closed by default;
//! file-only (see `config/trust.rs`). The policy itself is `net::policy`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::ConfigError;

/// Most `net.maxRedirects`.
pub const MAX_REDIRECTS: u32 = 20;
/// Default `net.maxBytes`: 10 MiB.
pub const DEFAULT_MAX_BYTES: u64 = 10 * 1024 * 1024;
/// Default `net.timeoutMs`: 30 seconds.
pub const DEFAULT_TIMEOUT_MS: u64 = 30_000;

/// `net`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct NetConfig {
    /// Fetches may reach loopback addresses (127.0.0.0/8, ::1, `localhost`).
    pub allow_loopback: bool,
    /// Fetches may reach private (RFC 1918, fc00::/7), shared (100.64.0.0/10) and link-local
    /// addresses. Cloud metadata addresses stay refused.
    pub allow_private: bool,
    /// Ranges fetches may reach whatever their class (e.g. `10.1.0.0/16`, `127.0.0.1/32`).
    /// Cloud metadata addresses and unspecified addresses stay refused even inside them.
    #[schemars(with = "Vec<String>")]
    pub allow_cidrs: Vec<ipnet::IpNet>,
    /// Redirects one fetch follows (0 to 20); one more is an error.
    #[schemars(range(max = MAX_REDIRECTS))]
    pub max_redirects: u32,
    /// Largest body one fetch reads, in bytes (at least 1); one byte more is an error.
    #[schemars(range(min = 1))]
    pub max_bytes: u64,
    /// Longest one fetch may take, redirects and body included, in milliseconds (at least 1).
    #[schemars(range(min = 1))]
    pub timeout_ms: u64,
}

impl Default for NetConfig {
    fn default() -> Self {
        Self {
            allow_loopback: false,
            allow_private: false,
            allow_cidrs: Vec::new(),
            max_redirects: 5,
            max_bytes: DEFAULT_MAX_BYTES,
            timeout_ms: DEFAULT_TIMEOUT_MS,
        }
    }
}

/// Checks the ranges; the error names the key.
pub fn validate(c: &NetConfig) -> Result<(), ConfigError> {
    if c.max_redirects > MAX_REDIRECTS {
        return Err(ConfigError(format!(
            "net.maxRedirects must be at most {MAX_REDIRECTS}"
        )));
    }
    if c.max_bytes == 0 || c.timeout_ms == 0 {
        return Err(ConfigError(
            "net.maxBytes and net.timeoutMs must be at least 1".to_owned(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn defaults_are_closed_and_the_shape_is_strict() {
        let c: NetConfig = serde_json::from_str("{}").unwrap();
        assert_eq!(c, NetConfig::default());
        assert!(!c.allow_loopback && !c.allow_private && c.allow_cidrs.is_empty());
        assert_eq!(
            (c.max_redirects, c.max_bytes, c.timeout_ms),
            (5, 10 << 20, 30_000)
        );
        let c: NetConfig =
            serde_json::from_str(r#"{"allowCidrs":["127.0.0.0/8","fd00::/8"],"maxRedirects":20}"#)
                .unwrap();
        assert_eq!(c.allow_cidrs.len(), 2);
        validate(&c).unwrap();
        assert!(serde_json::from_str::<NetConfig>(r#"{"allowCidrs":["nope"]}"#).is_err());
        assert!(serde_json::from_str::<NetConfig>(r#"{"allowLocalhost":true}"#).is_err());
        let too_many = NetConfig {
            max_redirects: 21,
            ..NetConfig::default()
        };
        assert!(validate(&too_many)
            .unwrap_err()
            .0
            .contains("net.maxRedirects"));
        let zero = NetConfig {
            max_bytes: 0,
            ..NetConfig::default()
        };
        assert!(validate(&zero).is_err());
    }
}
