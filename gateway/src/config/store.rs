//! `store`: which database the gateway keeps its state in (embedded SQLite by default, or a
//! PostgreSQL server shared by several gateway nodes), and the pool and node settings.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::webhooks::Secret;
use super::ConfigError;

/// Environment override of `store.url`.
pub const ENV_DATABASE_URL: &str = "AGENT_GATEWAY_DATABASE_URL";

/// Largest `store.acquireTimeoutMs` and `store.connectTimeoutMs`: 10 minutes.
pub const MAX_CONNECT_MS: u64 = 600_000;
/// Largest `store.statementTimeoutMs` and `store.nodeDeadAfterMs`: 24 hours.
pub const MAX_STATEMENT_MS: u64 = 86_400_000;
/// Largest `store.nodeHeartbeatMs`: 1 hour.
pub const MAX_NODE_HEARTBEAT_MS: u64 = 3_600_000;

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
    /// A request waits at most this long for a database connection, then gets -32003/503
    /// (at most 10 minutes).
    #[schemars(range(max = MAX_CONNECT_MS))]
    pub acquire_timeout_ms: u64,
    /// At start, a database that does not answer within this time stops the start (at most
    /// 10 minutes).
    #[schemars(range(max = MAX_CONNECT_MS))]
    pub connect_timeout_ms: u64,
    /// PostgreSQL `statement_timeout` of the gateway's connections (at most 24 hours).
    #[schemars(range(max = MAX_STATEMENT_MS))]
    pub statement_timeout_ms: u64,
    /// How often a node records that it is alive (PostgreSQL; at most 1 hour).
    #[schemars(range(max = MAX_NODE_HEARTBEAT_MS))]
    pub node_heartbeat_ms: u64,
    /// A node not seen for this long is dead: the queued runs it held are taken over (at
    /// most 24 hours).
    #[schemars(range(max = MAX_STATEMENT_MS))]
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

/// `url` with its secrets removed (for `config.read`, history, diffs, logs and errors): the
/// userinfo password is dropped, the value of every password-like query parameter
/// ([`is_secret_param`]) reads `[REDACTED]`, and a fragment is dropped. Other parameters keep
/// their text exactly, so the result is stable: a redacted URL written back unchanged is
/// recognised (`config::document::restore_redacted`). A URL that does not parse is not shown.
pub fn without_password(url: &str) -> String {
    let Ok(mut u) = url::Url::parse(url.trim()) else {
        return "<unparsable database URL>".to_owned();
    };
    if u.password().is_some() && u.set_password(None).is_err() {
        return "<unparsable database URL>".to_owned();
    }
    u.set_fragment(None);
    if let Some(query) = u.query().map(str::to_owned) {
        // Split by hand rather than through `query_pairs`: re-encoding would change the text
        // of the parameters that are kept.
        let kept: Vec<String> = query
            .split('&')
            .map(|pair| {
                let name = pair.split('=').next().unwrap_or_default();
                let decoded: String = url::form_urlencoded::parse(name.as_bytes())
                    .map(|(k, _)| k.into_owned())
                    .collect();
                if is_secret_param(&decoded) {
                    format!("{name}={}", super::REDACTED)
                } else {
                    pair.to_owned()
                }
            })
            .collect();
        u.set_query(Some(&kept.join("&")));
    }
    u.to_string()
}

/// Whether a connection URL's query parameter carries a secret, by name (case, `_` and `-`
/// ignored): passwords (`password`, `pass`, `passwd`, `pwd`, `sslpassword`...), secrets, tokens,
/// keys (`key`, `apikey`, `sslkey`...), credentials and auth values. Over-matching only hides a
/// harmless value from a display.
pub fn is_secret_param(name: &str) -> bool {
    let n: String = name
        .chars()
        .filter(|c| !matches!(c, '_' | '-' | '.'))
        .flat_map(char::to_lowercase)
        .collect();
    [
        "pass",
        "pwd",
        "secret",
        "token",
        "auth",
        "credential",
        "cred",
        "sig",
    ]
    .iter()
    .any(|w| n.contains(w))
        || n.ends_with("key")
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
    for (key, v, max) in [
        (
            "store.acquireTimeoutMs",
            s.acquire_timeout_ms,
            MAX_CONNECT_MS,
        ),
        (
            "store.connectTimeoutMs",
            s.connect_timeout_ms,
            MAX_CONNECT_MS,
        ),
        (
            "store.statementTimeoutMs",
            s.statement_timeout_ms,
            MAX_STATEMENT_MS,
        ),
        (
            "store.nodeHeartbeatMs",
            s.node_heartbeat_ms,
            MAX_NODE_HEARTBEAT_MS,
        ),
        (
            "store.nodeDeadAfterMs",
            s.node_dead_after_ms,
            MAX_STATEMENT_MS,
        ),
    ] {
        super::at_most(key, v, max)?;
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
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
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

    #[test]
    fn every_password_like_query_parameter_is_redacted_and_others_kept() {
        let url = "postgres://u:pw@h/db?password=x&sslpassword=y&application_name=z";
        let shown = without_password(url);
        assert_eq!(
            shown,
            "postgres://u@h/db?password=[REDACTED]&sslpassword=[REDACTED]&application_name=z"
        );
        // Names in any case and spelling; values with escapes; parameters without a value.
        let shown = without_password(
            "postgresql://h/db?PassWord=a%26b&API_KEY=k1&apiKey=k2&Token=t&pwd=p&sslkey=/k\
             &secret=s&auth_token=q&sslmode=verify-full&options=-c%20x%3Dy&flag#frag",
        );
        for secret in ["a%26b", "k1", "k2", "=t", "=p", "/k", "=s", "=q", "frag"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        assert!(shown.contains("sslmode=verify-full"), "{shown}");
        assert!(shown.contains("options=-c%20x%3Dy"), "{shown}");
        assert!(shown.contains("&flag"), "{shown}");
        // Stable: redacting twice changes nothing (the restore of a redacted read relies on it).
        assert_eq!(without_password(&shown), shown);
        assert_eq!(without_password("not a url"), "<unparsable database URL>");
        let debug = format!("{:?}", backend_of(url).ok());
        for secret in ["pw", "=x", "=y"] {
            assert!(!debug.contains(secret), "{debug}");
        }
        assert!(!is_secret_param("application_name"));
        assert!(!is_secret_param("sslmode"));
        assert!(!is_secret_param("sslrootcert"));
    }

    /// No configuration struct prints a secret through `Debug` (a `?config` in a log line).
    #[test]
    fn debug_of_the_configuration_shows_no_secret() {
        let config = crate::config::parse(
            "gateway:\n  tokens:\n    - {id: a, secret: tok-0123456789012345678901234567890}\n\
             webhooks:\n  token: hook-0123456789012345678901234567890\n\
             \x20 hmac: {secret: hmac-0123456789012345678901234567890}\n\
             store:\n  url: postgres://u:pw-secret@h/db?sslpassword=ssl-secret\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let debug = format!("{config:?}");
        for secret in ["tok-0", "hook-0", "hmac-0", "pw-secret", "ssl-secret"] {
            assert!(!debug.contains(secret), "{secret} in {debug}");
        }
        let backend = config.store.backend().unwrap_or_else(|e| panic!("{e}"));
        assert!(!format!("{backend:?}").contains("secret"));
    }

    #[test]
    fn durations_are_capped_at_their_maximum() {
        let at = |f: fn(&mut StoreConfig, u64), v: u64| {
            let mut s = StoreConfig {
                node_dead_after_ms: MAX_STATEMENT_MS,
                ..StoreConfig::default()
            };
            f(&mut s, v);
            validate(&s)
        };
        type Case = (&'static str, fn(&mut StoreConfig, u64), u64);
        let cases: [Case; 5] = [
            (
                "store.acquireTimeoutMs",
                |s, v| s.acquire_timeout_ms = v,
                MAX_CONNECT_MS,
            ),
            (
                "store.connectTimeoutMs",
                |s, v| s.connect_timeout_ms = v,
                MAX_CONNECT_MS,
            ),
            (
                "store.statementTimeoutMs",
                |s, v| s.statement_timeout_ms = v,
                MAX_STATEMENT_MS,
            ),
            (
                "store.nodeHeartbeatMs",
                |s, v| s.node_heartbeat_ms = v,
                MAX_NODE_HEARTBEAT_MS,
            ),
            (
                "store.nodeDeadAfterMs",
                |s, v| s.node_dead_after_ms = v,
                MAX_STATEMENT_MS,
            ),
        ];
        for (key, f, max) in cases {
            assert!(at(f, max).is_ok(), "{key} at {max}");
            for v in [max + 1, u64::MAX] {
                let e = at(f, v)
                    .err()
                    .unwrap_or_else(|| panic!("{key} = {v} passed"));
                assert!(e.0.contains(key), "{}", e.0);
            }
        }
    }
}
