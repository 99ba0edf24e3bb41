//! `secrets`: where the master key of the secret store comes from (the environment, else a
//! private key file), read and checked at load. The store itself is `secrets.rs`.

use std::path::PathBuf;

use base64::Engine as _;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::ConfigError;

/// The environment variable holding the master key (base64 of 32 bytes); it wins over the file.
pub const ENV_MASTER_KEY: &str = "AGENT_GATEWAY_MASTER_KEY";

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD
}

/// `secrets`: where the master key comes from besides the environment.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct SecretsConfig {
    /// A file holding the master key (base64 of 32 random bytes); it must not be readable by
    /// group or others (mode 0600). `AGENT_GATEWAY_MASTER_KEY` wins when both are set.
    pub master_key_file: Option<PathBuf>,
}

/// Decodes a master key: base64 (standard or URL-safe, padding optional) of exactly 32 bytes.
pub(crate) fn decode_key(text: &str, source: &str) -> Result<[u8; 32], ConfigError> {
    let t = text.trim();
    let bytes = b64()
        .decode(t)
        .or_else(|_| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(t.trim_end_matches('='))
        })
        .map_err(|_| ConfigError(format!("{source}: the master key is not base64")))?;
    bytes.try_into().map_err(|b: Vec<u8>| {
        ConfigError(format!(
            "{source}: the master key must be 32 bytes (base64 of 32 random bytes), got {}",
            b.len()
        ))
    })
}

/// The master key from `AGENT_GATEWAY_MASTER_KEY`, else `secrets.masterKeyFile`; None when
/// neither is set. A key file readable by group or others is refused.
pub fn master_key(config: &SecretsConfig) -> Result<Option<[u8; 32]>, ConfigError> {
    if let Ok(v) = std::env::var(ENV_MASTER_KEY) {
        if !v.trim().is_empty() {
            return decode_key(&v, ENV_MASTER_KEY).map(Some);
        }
    }
    let Some(path) = &config.master_key_file else {
        return Ok(None);
    };
    let shown = format!("secrets.masterKeyFile ({})", path.display());
    let meta =
        std::fs::metadata(path).map_err(|e| ConfigError(format!("{shown}: cannot read: {e}")))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(ConfigError(format!(
                "{shown}: mode {mode:o} lets others read the master key; chmod 600 it"
            )));
        }
    }
    #[cfg(not(unix))]
    let _ = meta;
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError(format!("{shown}: {e}")))?;
    decode_key(&text, &shown).map(Some)
}
