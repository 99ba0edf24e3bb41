//! `store`: which database the gateway keeps its state in (embedded SQLite by default, or a
//! PostgreSQL server shared by several gateway nodes), and the pool and node settings.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::webhooks::Secret;
use super::ConfigError;

/// Environment override of `store.url`.
pub const ENV_DATABASE_URL: &str = "AGENT_GATEWAY_DATABASE_URL";

/// `store`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct StoreConfig {
    /// `postgres://user:password@host:port/database` (inline or `{env: NAME}`); unset: the
    /// embedded SQLite file `<dataDir>/gateway.db`. `sqlite://<path>` names another SQLite file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<Secret>,
    /// PostgreSQL connections per node at most.
    pub max_connections: u32,
    /// A request waits at most this long for a database connection, then gets -32003/503.
    pub acquire_timeout_ms: u64,
    /// At start, a database that does not answer within this time stops the start.
    pub connect_timeout_ms: u64,
    /// PostgreSQL `statement_timeout` of the gateway's connections.
    pub statement_timeout_ms: u64,
    /// How often a node records that it is alive (PostgreSQL).
    pub node_heartbeat_ms: u64,
    /// A node not seen for this long is dead: the queued runs it held are taken over.
    pub node_dead_after_ms: u64,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            url: None,
            max_connections: 10,
            acquire_timeout_ms: 3_000,
            connect_timeout_ms: 10_000,
            statement_timeout_ms: 30_000,
            node_heartbeat_ms: 5_000,
            node_dead_after_ms: 20_000,
        }
    }
}

/// Which database, resolved from `store.url`.
#[derive(Clone, PartialEq, Eq)]
pub enum Backend {
    /// SQLite at this path (None: `<dataDir>/gateway.db`).
    Sqlite(Option<std::path::PathBuf>),
    /// A PostgreSQL URL (with its password; print it with [`without_password`]).
    Postgres(String),
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Sqlite(p) => write!(f, "Sqlite({p:?})"),
            Self::Postgres(u) => write!(f, "Postgres({})", without_password(u)),
        }
    }
}

impl Backend {
    /// `sqlite` or `postgres`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Sqlite(_) => "sqlite",
            Self::Postgres(_) => "postgres",
        }
    }

    /// The SQLite file: the one the URL names, else `default` (`<dataDir>/gateway.db`); None
    /// on PostgreSQL.
    pub fn sqlite_file<'a>(&'a self, default: &'a std::path::Path) -> Option<&'a std::path::Path> {
        match self {
            Self::Sqlite(path) => Some(path.as_deref().unwrap_or(default)),
            Self::Postgres(_) => None,
        }
    }

    /// The database as logs and errors name it: the SQLite file, or the URL without its
    /// password.
    pub fn shown(&self, default: &std::path::Path) -> String {
        match self {
            Self::Sqlite(path) => path.as_deref().unwrap_or(default).display().to_string(),
            Self::Postgres(url) => without_password(url),
        }
    }
}

impl StoreConfig {
    /// The backend `url` names; errors name `store.url`.
    pub fn backend(&self) -> Result<Backend, ConfigError> {
        let Some(secret) = &self.url else {
            return Ok(Backend::Sqlite(None));
        };
        backend_of(&secret.resolve("store.url")?)
    }
}

/// The backend a database URL names.
pub fn backend_of(url: &str) -> Result<Backend, ConfigError> {
    let url = url.trim();
    if let Some(path) = url.strip_prefix("sqlite://") {
        if path.is_empty() {
            return Err(ConfigError("store.url: sqlite:// needs a file path".into()));
        }
        return Ok(Backend::Sqlite(Some(path.into())));
    }
    match url::Url::parse(url) {
        Ok(u) if matches!(u.scheme(), "postgres" | "postgresql") => {
            Ok(Backend::Postgres(url.to_owned()))
        }
        Ok(u) => Err(ConfigError(format!(
            "store.url: unsupported scheme '{}' (postgres://... or sqlite://...)",
            u.scheme()
        ))),
        Err(_) => Err(ConfigError(
            "store.url is not a URL (postgres://user@host:5432/database)".into(),
        )),
    }
}

/// `url` with its password removed (for logs and errors).
pub fn without_password(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) => {
            if u.password().is_some() {
                let _ = u.set_password(None);
            }
            u.to_string()
        }
        Err(_) => "<unparsable database URL>".to_owned(),
    }
}

/// Rules serde cannot express.
pub fn validate(s: &StoreConfig) -> Result<(), ConfigError> {
    for (key, v) in [
        ("store.maxConnections", u64::from(s.max_connections)),
        ("store.acquireTimeoutMs", s.acquire_timeout_ms),
        ("store.connectTimeoutMs", s.connect_timeout_ms),
        ("store.nodeHeartbeatMs", s.node_heartbeat_ms),
    ] {
        if v == 0 {
            return Err(ConfigError(format!("{key} must be greater than 0")));
        }
    }
    if s.node_dead_after_ms < 2 * s.node_heartbeat_ms {
        return Err(ConfigError(
            "store.nodeDeadAfterMs must be at least twice store.nodeHeartbeatMs".into(),
        ));
    }
    // An unset environment variable is reported at start, where the value is needed: the
    // configuration stays checkable (check-config) on a machine without the secret.
    if let Some(Secret::Inline(url)) = &s.url {
        backend_of(url)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_choose_the_backend_and_passwords_never_print() {
        assert_eq!(
            backend_of("postgres://gw:pw@db:5432/x").ok(),
            Some(Backend::Postgres("postgres://gw:pw@db:5432/x".into()))
        );
        assert!(matches!(
            backend_of("postgresql://db/x"),
            Ok(Backend::Postgres(_))
        ));
        assert_eq!(
            backend_of("sqlite:///tmp/a.db").ok(),
            Some(Backend::Sqlite(Some("/tmp/a.db".into())))
        );
        for bad in ["mysql://db/x", "not a url", "sqlite://"] {
            assert!(backend_of(bad).is_err(), "{bad}");
        }
        let shown = without_password("postgres://gw:hunter2@db:5432/x");
        assert_eq!(shown, "postgres://gw@db:5432/x");
        let debug = format!("{:?}", backend_of("postgres://gw:hunter2@db/x").ok());
        assert!(!debug.contains("hunter2"), "{debug}");
    }
}
