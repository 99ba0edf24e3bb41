//! `workspaces`: what the workspace methods never reach (`docs/workspaces.md`).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::ConfigError;

/// Most `workspaces.privatePaths` entries.
pub const MAX_PRIVATE_PATHS: usize = 256;

/// `workspaces`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct WorkspacesConfig {
    /// Paths of every agent's workspace the workspace methods refuse to list, read, write or
    /// delete (-32602): an entry with a `/` is a path from the workspace root (it and
    /// everything below it, `gates/`), one without names a file or directory anywhere
    /// (`.netrc`). `.git` is always refused. At most 256 entries.
    pub private_paths: Vec<String>,
}

impl Default for WorkspacesConfig {
    fn default() -> Self {
        Self {
            private_paths: [".netrc", ".ssh", ".env", ".git-credentials", "gates/"]
                .map(str::to_owned)
                .to_vec(),
        }
    }
}

/// Checks the entries: relative, no `.`/`..`/empty segment, no NUL, at most 256.
pub fn validate(c: &WorkspacesConfig) -> Result<(), ConfigError> {
    if c.private_paths.len() > MAX_PRIVATE_PATHS {
        return Err(ConfigError(format!(
            "workspaces.privatePaths has more than {MAX_PRIVATE_PATHS} entries"
        )));
    }
    for p in &c.private_paths {
        let body = p.strip_suffix('/').unwrap_or(p);
        let bad = body.is_empty()
            || body.starts_with('/')
            || body.contains('\0')
            || body.split('/').any(|s| matches!(s, "" | "." | ".."));
        if bad {
            return Err(ConfigError(format!(
                "workspaces.privatePaths: '{p}' is not a relative path without '.', '..' or empty segments"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_relative_and_bounded() {
        assert!(validate(&WorkspacesConfig::default()).is_ok());
        for bad in ["", "/etc", "a/../b", "./x", "a//b", "/"] {
            let c = WorkspacesConfig {
                private_paths: vec![bad.to_owned()],
            };
            assert!(validate(&c).is_err(), "{bad:?}");
        }
        let at = WorkspacesConfig {
            private_paths: vec!["x".to_owned(); MAX_PRIVATE_PATHS],
        };
        assert!(validate(&at).is_ok(), "at the limit");
        let past = WorkspacesConfig {
            private_paths: vec!["x".to_owned(); MAX_PRIVATE_PATHS + 1],
        };
        assert!(validate(&past).is_err(), "past it");
    }
}
