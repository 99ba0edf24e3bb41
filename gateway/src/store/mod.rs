//! The store: one interface over two sqlx backends, the embedded SQLite file (default) and a
//! PostgreSQL server shared by several gateway nodes; opening, migrations, and one module per
//! table group.
//!
//! Every statement is written once with `$N` parameters (sqlx's SQLite driver binds `$N` to
//! argument N too) and run on either pool through [`on_pool!`]; rows decode through
//! [`StoreRow`]. Only full-text search and connection setup differ per backend. The writer's
//! statements, run for every request, go through [`dialect::sql`]: SQLite gets their `?` form
//! (bound by position, where `$N` names cost a scan per parameter).
//!
//! Durability: SQLite runs in WAL with `synchronous = NORMAL`, which survives a killed process
//! (kill -9) with every committed transaction; PostgreSQL commits durably by its own settings.
//! Every acknowledged write is committed before the answer is sent.

pub mod approvals;
mod batch;
#[cfg(test)]
mod conformance;
pub mod context;
pub mod control_plane;
pub mod dialect;
pub mod files;
pub mod filter;
pub mod graphs;
pub mod memory;
pub mod nodes;
pub mod obs;
pub mod owners;
pub mod records;
pub mod registry;
pub mod runs;
pub mod scheduler;
pub mod search;
pub mod sessions;
pub mod transfer;
pub mod usage;

use crate::clock::now_ms;
use std::borrow::Cow;
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgRow};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteRow, SqliteSynchronous,
};
use sqlx::{Row, SqlitePool};

use crate::api::error::GatewayError;
use crate::config::store::{without_password, Backend, StoreConfig, MAX_CONNECT_MS};

/// File name of the database inside the data directory.
pub const DB_FILE: &str = "gateway.db";

/// The migrations of each backend: the same versions and descriptions (a unit test checks).
pub static SQLITE_MIGRATIONS: Migrator = sqlx::migrate!("gateway/migrations/sqlite");
/// PostgreSQL's ignores versions it does not know: a node of the previous version restarted
/// after a newer node migrated the shared database still starts (rolling upgrades; migrations
/// only add, so the older code keeps working).
pub static POSTGRES_MIGRATIONS: std::sync::LazyLock<Migrator> = std::sync::LazyLock::new(|| {
    let mut m = sqlx::migrate!("gateway/migrations/postgres");
    m.set_ignore_missing(true);
    m
});

/// A pool of either backend.
#[derive(Clone, Debug)]
pub enum Pool {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

/// Runs `$body` with `$p` bound to the pool of whichever backend `$pool` is: one body, compiled
/// once per backend.
macro_rules! on_pool {
    ($pool:expr, |$p:ident| $body:expr) => {
        match $pool {
            $crate::store::Pool::Sqlite($p) => $body,
            $crate::store::Pool::Postgres($p) => $body,
        }
    };
}
pub(crate) use on_pool;

/// A handle on the database; cheap to clone.
#[derive(Clone)]
pub struct Store {
    pool: Pool,
    /// Group commit of usage rows (see `usage.rs`).
    usage: usage::UsageQueue,
    /// The gateway node (process) this handle writes for: it holds the runs it starts.
    node: Arc<str>,
    /// How long a node may go unseen before it counts as dead (shared databases only; on
    /// SQLite only this process is alive).
    dead_after_ms: Option<i64>,
}

impl Store {
    /// Opens (creating when missing) the SQLite database at `path` and applies pending
    /// migrations. The file is made private first (0600, see [`files`]); the path goes to
    /// sqlx as a file name, never inside a URL, so `?`, `#` and `%` in it are plain
    /// characters.
    pub async fn open(path: &Path) -> Result<Self, GatewayError> {
        files::secure_sqlite_file(path).map_err(|e| {
            GatewayError::Unavailable(format!("cannot create {}: {e}", path.display()))
        })?;
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .foreign_keys(true)
            .busy_timeout(Duration::from_secs(10));
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await?;
        Self::migrated(Pool::Sqlite(pool)).await
    }

    /// The database `config` names (`store.url`; default: SQLite `<data_dir>/gateway.db`),
    /// migrated, and the key that identifies it within this process (a path, or the URL
    /// without its password).
    pub async fn connect(
        config: &StoreConfig,
        data_dir: &Path,
    ) -> Result<(Self, String), GatewayError> {
        let backend = config
            .backend()
            .map_err(|e| GatewayError::Unavailable(e.0))?;
        match backend {
            Backend::Sqlite(path) => {
                let path = path.unwrap_or_else(|| data_dir.join(DB_FILE));
                let store = Self::open(&path).await?;
                let key = std::fs::canonicalize(&path).unwrap_or(path);
                Ok((store, key.display().to_string()))
            }
            Backend::Postgres(url) => {
                let store = Self::connect_postgres(&url, config).await?;
                Ok((store, without_password(&url)))
            }
        }
    }

    /// Connects to the PostgreSQL database at `url` and applies pending migrations (several
    /// nodes starting together are safe: the migrator holds an advisory lock). Fails within
    /// `connectTimeoutMs` when the server does not answer, naming the URL without password.
    pub async fn connect_postgres(url: &str, s: &StoreConfig) -> Result<Self, GatewayError> {
        let shown = without_password(url);
        let refused =
            |e: &dyn std::fmt::Display| format!("cannot connect to PostgreSQL at {shown}: {e}");
        let url = known_parameters_only(url);
        let options = PgConnectOptions::from_str(&url)
            .map_err(|e| GatewayError::Unavailable(refused(&e)))?
            .application_name("agent-gateway")
            .options([("statement_timeout", s.statement_timeout_ms.to_string())]);
        let pool = PgPoolOptions::new()
            .max_connections(s.max_connections)
            .acquire_timeout(Duration::from_millis(s.acquire_timeout_ms))
            .idle_timeout(Duration::from_secs(60))
            .connect_lazy_with(options);
        // A server still starting is waited for until the deadline; a refusal from the server
        // itself (authentication, unknown database) ends the start at once.
        // Capped at load (store.connectTimeoutMs); clamped again so no value can overflow.
        let wait = Duration::from_millis(s.connect_timeout_ms.min(MAX_CONNECT_MS));
        let now = tokio::time::Instant::now();
        let deadline = now.checked_add(wait).unwrap_or(now);
        loop {
            match pool.acquire().await {
                Ok(_) => break,
                Err(e) => {
                    let final_answer =
                        matches!(e, sqlx::Error::Database(_) | sqlx::Error::Configuration(_));
                    if final_answer || tokio::time::Instant::now() >= deadline {
                        return Err(GatewayError::Unavailable(refused(&e)));
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
        let mut store = Self::migrated(Pool::Postgres(pool)).await?;
        store.dead_after_ms = Some(s.node_dead_after_ms as i64);
        Ok(store)
    }

    async fn migrated(pool: Pool) -> Result<Self, GatewayError> {
        let applied = match &pool {
            Pool::Sqlite(p) => SQLITE_MIGRATIONS.run(p).await,
            Pool::Postgres(p) => POSTGRES_MIGRATIONS.run(p).await,
        };
        applied.map_err(|e| GatewayError::Internal(format!("database migration failed: {e}")))?;
        let usage = usage::UsageQueue::start(pool.clone());
        let node = uuid::Uuid::new_v4().simple().to_string().into();
        Ok(Self {
            pool,
            usage,
            node,
            dead_after_ms: None,
        })
    }

    /// A private in-memory database with every migration applied (the configuration dry run
    /// of `check-config` and restart): one connection, kept for the store's life, since each
    /// in-memory connection would be a database of its own.
    pub async fn open_in_memory() -> Result<Self, GatewayError> {
        let options = SqliteConnectOptions::from_str("sqlite::memory:")?.foreign_keys(true);
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .idle_timeout(None)
            .max_lifetime(None)
            .connect_with(options)
            .await?;
        Self::migrated(Pool::Sqlite(pool)).await
    }

    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// This handle writing for node `node` (a fresh store writes for a random node of its own).
    pub fn for_node(mut self, node: Arc<str>) -> Self {
        self.node = node;
        self
    }

    /// Nodes seen after this time are alive (None: on SQLite, only this process is).
    pub fn live_since(&self) -> Option<i64> {
        self.dead_after_ms.map(|d| now_ms() - d)
    }

    /// The node this handle writes for.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// `sqlite` or `postgres`.
    pub fn backend_name(&self) -> &'static str {
        match self.pool {
            Pool::Sqlite(_) => "sqlite",
            Pool::Postgres(_) => "postgres",
        }
    }

    /// Bytes the database takes: SQLite's pages, PostgreSQL's database size.
    pub async fn size_bytes(&self) -> Result<i64, GatewayError> {
        Ok(match &self.pool {
            Pool::Sqlite(p) => {
                sqlx::query_scalar(
                    "SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()",
                )
                .fetch_one(p)
                .await?
            }
            Pool::Postgres(p) => {
                sqlx::query_scalar("SELECT pg_database_size(current_database())::bigint")
                    .fetch_one(p)
                    .await?
            }
        })
    }

    /// Whether several nodes may share this database (PostgreSQL).
    pub fn is_shared(&self) -> bool {
        matches!(self.pool, Pool::Postgres(_))
    }

    /// Closes the pool (a restart's previous generation, shutdown): waits for connections in
    /// use to be returned.
    pub async fn close(&self) {
        on_pool!(&self.pool, |p| p.close().await)
    }
}

/// The query parameters sqlx's PostgreSQL driver understands (sqlx-postgres 0.8
/// `options/parse.rs`), besides `options[...]`.
const PG_PARAMETERS: &[&str] = &[
    "sslmode",
    "ssl-mode",
    "sslrootcert",
    "ssl-root-cert",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "statement-cache-capacity",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "application_name",
    "options",
];

/// `url` without the query parameters sqlx would ignore: sqlx logs an ignored parameter
/// with its value (`sslpassword=...` would reach the log), so they are dropped here and only
/// their names are logged. The text of the kept parameters is unchanged.
fn known_parameters_only(url: &str) -> String {
    let Ok(mut u) = url::Url::parse(url) else {
        return url.to_owned();
    };
    let Some(query) = u.query().map(str::to_owned) else {
        return url.to_owned();
    };
    let mut ignored = Vec::new();
    let kept: Vec<&str> = query
        .split('&')
        .filter(|pair| {
            let name: String = url::form_urlencoded::parse(pair.as_bytes())
                .next()
                .map(|(k, _)| k.into_owned())
                .unwrap_or_default();
            let known = pair.is_empty()
                || PG_PARAMETERS.contains(&name.as_str())
                || (name.starts_with("options[") && name.ends_with(']'));
            if !known {
                ignored.push(name);
            }
            known
        })
        .collect();
    if ignored.is_empty() {
        return url.to_owned();
    }
    let names = ignored.join(", ");
    tracing::warn!(
        parameters = %crate::logging::escaped(&names),
        "store.url: ignoring query parameters the PostgreSQL driver does not know"
    );
    u.set_query((!kept.is_empty()).then(|| kept.join("&")).as_deref());
    u.to_string()
}

/// The highest migration version this build knows.
pub fn schema_version() -> i64 {
    SQLITE_MIGRATIONS
        .iter()
        .map(|m| m.version)
        .max()
        .unwrap_or(0)
}

/// Free text as stored: U+0000, which PostgreSQL text cannot hold, becomes U+FFFD on every
/// backend, so both store the same thing.
pub fn text(s: &str) -> Cow<'_, str> {
    if s.contains('\0') {
        Cow::Owned(s.replace('\0', "\u{FFFD}"))
    } else {
        Cow::Borrowed(s)
    }
}

/// [`text`] of an optional value.
pub fn opt_text(s: &Option<String>) -> Option<Cow<'_, str>> {
    s.as_deref().map(text)
}

/// One column's value decoded from a row of either backend.
pub trait Column: Sized {
    fn sqlite(r: &SqliteRow, col: &str) -> Result<Self, sqlx::Error>;
    fn postgres(r: &PgRow, col: &str) -> Result<Self, sqlx::Error>;
}

macro_rules! column {
    ($($t:ty),*) => {$(
        impl Column for $t {
            fn sqlite(r: &SqliteRow, col: &str) -> Result<Self, sqlx::Error> {
                r.try_get(col)
            }
            fn postgres(r: &PgRow, col: &str) -> Result<Self, sqlx::Error> {
                r.try_get(col)
            }
        }
    )*};
}
column!(
    i64,
    f64,
    String,
    Option<i64>,
    Option<f64>,
    Option<String>,
    Vec<u8>,
    Option<Vec<u8>>
);

/// A row of either backend, read by column name.
pub trait StoreRow {
    fn col<T: Column>(&self, col: &str) -> Result<T, sqlx::Error>;
}

impl StoreRow for SqliteRow {
    fn col<T: Column>(&self, col: &str) -> Result<T, sqlx::Error> {
        T::sqlite(self, col)
    }
}

impl StoreRow for PgRow {
    fn col<T: Column>(&self, col: &str) -> Result<T, sqlx::Error> {
        T::postgres(self, col)
    }
}

/// The suite's throwaway PostgreSQL server, for the store's own tests on both backends.
#[cfg(test)]
#[path = "../../../tests/suite/pg.rs"]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
pub(crate) mod pg_harness;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_backends_have_the_same_migrations() {
        let of = |m: &Migrator| {
            m.iter()
                .map(|m| (m.version, m.description.to_string()))
                .collect::<Vec<_>>()
        };
        assert_eq!(of(&SQLITE_MIGRATIONS), of(&POSTGRES_MIGRATIONS));
        assert_eq!(schema_version(), 12);
    }

    /// A migration already applied somewhere must never change: sqlx refuses to open a
    /// database whose applied migration's checksum differs ("previously applied but has been
    /// modified"). These are the SHA-384 of the files as released (1 and 2 read from a
    /// `gateway.db` made by an earlier build).
    #[test]
    fn released_migrations_keep_their_checksums() {
        let released = [
            (1, "da2f2dccdc258c3515669a4d88f2d71b1df63ea3e268748d643b761d943657186bf7319d7a9fef16f06dd9ec1ad75e2c"),
            (2, "2fede53d2d116519dcd0a610912f6cce72308aa7d4c42bcfc691eed6c2788ea3bcf3705ae8011bbe09166cc3a19af319"),
            (3, "a9e9792e552e203905dcfb2c587cf236836183bad7344519d86e2fd9964919b081bd557b57bab6ee5077f77d02acdd1c"),
            (4, "0e6478b1af88256deb697bfdabd9596204079b38e89e03d9155fccfb91968e52a3243b5c32f8fa8ffa1f60c46f1174d3"),
        ];
        for (version, hex) in released {
            let m = SQLITE_MIGRATIONS
                .iter()
                .find(|m| m.version == version)
                .unwrap_or_else(|| panic!("migration {version} is gone"));
            let got: String = m.checksum.iter().map(|b| format!("{b:02x}")).collect();
            assert_eq!(got, hex, "sqlite migration {version} was edited");
        }
    }

    /// A node of the previous version restarting after a newer node migrated the shared
    /// database still starts (rolling upgrades).
    #[tokio::test]
    async fn a_postgres_database_migrated_by_a_newer_build_still_opens() {
        let url = pg_harness::database().await;
        let first = Store::connect_postgres(&url, &StoreConfig::default())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let Pool::Postgres(p) = first.pool() else {
            panic!("not postgres");
        };
        sqlx::query(
            "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
             VALUES (99, 'from a newer build', true, '\\x00', 0)",
        )
        .execute(p)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        first.close().await;
        let again = Store::connect_postgres(&url, &StoreConfig::default()).await;
        assert!(again.is_ok(), "{:?}", again.err());
    }

    /// `sslmode=verify-full` with the server's CA: the gateway's connections are encrypted
    /// and the server is authenticated; a CA that did not sign the server is refused.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_connections_use_tls_when_the_url_asks() {
        let server = pg_harness::private_server();
        let url = server.database().await;
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let openssl = |args: &[&str]| {
            let out = std::process::Command::new("openssl")
                .args(args)
                .current_dir(dir.path())
                .output()
                .unwrap_or_else(|e| panic!("openssl: {e}"));
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        for ca in ["ca", "other-ca"] {
            openssl(&[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "1",
                "-subj",
                &format!("/CN={ca}"),
                "-keyout",
                &format!("{ca}.key"),
                "-out",
                &format!("{ca}.crt"),
            ]);
        }
        openssl(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=127.0.0.1",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
        ]);
        std::fs::write(
            dir.path().join("ext"),
            "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        openssl(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            "ext",
            "-out",
            "server.crt",
        ]);
        for f in ["server.crt", "server.key"] {
            pg_harness::give_to_server(&dir.path().join(f));
        }
        pg_harness::give_to_server(dir.path());
        let mut admin = <sqlx::PgConnection as sqlx::Connection>::connect(&url)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        for (key, file) in [
            ("ssl_cert_file", "server.crt"),
            ("ssl_key_file", "server.key"),
        ] {
            let path = dir.path().join(file).display().to_string();
            sqlx::query(&format!("ALTER SYSTEM SET {key} = '{path}'"))
                .execute(&mut admin)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
        }
        for sql in ["ALTER SYSTEM SET ssl = on", "SELECT pg_reload_conf()"] {
            sqlx::query(sql)
                .execute(&mut admin)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let ca = |name: &str| dir.path().join(name).display().to_string();
        let tls = format!("{url}?sslmode=verify-full&sslrootcert={}", ca("ca.crt"));
        let store = Store::connect_postgres(&tls, &StoreConfig::default())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let Pool::Postgres(p) = store.pool() else {
            panic!("not postgres");
        };
        let encrypted: bool =
            sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
                .fetch_one(p)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
        assert!(encrypted);
        let forged = format!(
            "{url}?sslmode=verify-full&sslrootcert={}",
            ca("other-ca.crt")
        );
        let config = StoreConfig {
            connect_timeout_ms: 500,
            ..StoreConfig::default()
        };
        assert!(Store::connect_postgres(&forged, &config).await.is_err());
        drop(server);
    }

    #[test]
    fn unknown_postgres_parameters_are_dropped_before_sqlx_sees_them() {
        let url = "postgres://u:pw@h/db?sslpassword=y&application_name=z&options%5Bx%5D=1&token=t";
        let kept = known_parameters_only(url);
        assert_eq!(
            kept,
            "postgres://u:pw@h/db?application_name=z&options%5Bx%5D=1"
        );
        assert_eq!(
            known_parameters_only("postgres://h/db?sslmode=disable"),
            "postgres://h/db?sslmode=disable"
        );
        assert_eq!(
            known_parameters_only("postgres://h/db?secret=1"),
            "postgres://h/db"
        );
    }

    /// A SQLite path with characters a URL would read as syntax opens as the file it names.
    #[tokio::test]
    async fn a_sqlite_path_with_url_syntax_characters_opens() {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let dir = tmp.path().join("a?b#c%d");
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("{e}"));
        let path = dir.join(DB_FILE);
        let store = Store::open(&path).await.unwrap_or_else(|e| panic!("{e}"));
        store.close().await;
        assert!(path.is_file());
        let names: Vec<_> = std::fs::read_dir(tmp.path())
            .unwrap_or_else(|e| panic!("{e}"))
            .filter_map(|e| e.ok().map(|e| e.file_name()))
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
    }

    #[test]
    fn nul_characters_are_replaced_and_other_text_is_kept() {
        assert_eq!(text("a\0b"), "a\u{FFFD}b");
        assert!(matches!(text("plain"), Cow::Borrowed("plain")));
    }
}
