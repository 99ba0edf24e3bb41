//! The embedded SQLite store (sqlx, WAL): opening, migrations, and one module per table group.
//!
//! Durability: WAL with `synchronous = NORMAL` survives a killed process (kill -9) with every
//! committed transaction; only an OS crash or power loss can drop the last commits. Every
//! acknowledged write is committed before the answer is sent.

pub mod memory;
pub mod owners;
pub mod registry;
pub mod runs;
pub mod search;
pub mod sessions;
pub mod usage;

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::SqlitePool;

use crate::error::GatewayError;

/// File name of the database inside the data directory.
pub const DB_FILE: &str = "gateway.db";

/// A handle on the database; cheap to clone.
#[derive(Clone)]
pub struct Store {
    pool: SqlitePool,
    /// Group commit of usage rows (see `usage.rs`).
    usage: usage::UsageQueue,
}

impl Store {
    /// Opens (creating when missing) the database at `path` and applies pending migrations.
    pub async fn open(path: &Path) -> Result<Self, GatewayError> {
        let url = format!("sqlite://{}", path.display());
        let options = SqliteConnectOptions::from_str(&url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .foreign_keys(true)
            .busy_timeout(Duration::from_secs(10));
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await?;
        sqlx::migrate!("gateway/migrations")
            .run(&pool)
            .await
            .map_err(|e| GatewayError::Internal(format!("database migration failed: {e}")))?;
        let usage = usage::UsageQueue::start(pool.clone());
        Ok(Self { pool, usage })
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
        sqlx::migrate!("gateway/migrations")
            .run(&pool)
            .await
            .map_err(|e| GatewayError::Internal(format!("database migration failed: {e}")))?;
        let usage = usage::UsageQueue::start(pool.clone());
        Ok(Self { pool, usage })
    }

    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }
}

/// Now as epoch milliseconds.
pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}
