//! `providerPolicy`: what provider settings made through the API may name (the key
//! allow-list and the address classes a `baseUrl` may reach). The policy itself is enforced in
//! `providers/policy.rs`; this is its file shape and load-time check.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `providerPolicy`: limits on provider settings made through the API.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct ProviderPolicyConfig {
    /// Environment variables `providers.create/update` may name in `apiKeyEnv`, besides those
    /// the file's own providers name (their `apiKeyEnv`, or the type's default).
    pub api_key_env_allowlist: Vec<String>,
    /// A `baseUrl` set through the API may reach loopback addresses (a local Ollama, tests).
    pub allow_loopback_base_url: bool,
    /// A `baseUrl` set through the API may reach private, shared (CGNAT), unique-local and
    /// link-local addresses. Cloud metadata addresses stay refused.
    pub allow_private_base_url: bool,
}

/// Whether `name` can be an environment variable name (what the allow-list may hold).
pub fn valid_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Checks the file's `providerPolicy` at load; the error names the key.
pub fn validate(c: &ProviderPolicyConfig) -> Result<(), String> {
    for (i, name) in c.api_key_env_allowlist.iter().enumerate() {
        if !valid_env_name(name) {
            return Err(format!(
                "providerPolicy.apiKeyEnvAllowlist[{i}]: {name:?} is not an environment variable name (letters, digits and _, not starting with a digit)"
            ));
        }
    }
    Ok(())
}
