//! The one domain error type. Its wire mappings live at the edges: `rpc/error.rs` (JSON-RPC)
//! and `transport/problem.rs` (REST and `/v1`).

/// What a handler or service can fail with. Internal details are logged, never returned.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// The request is well-formed JSON-RPC but its values are unusable.
    #[error("{0}")]
    InvalidParams(String),
    /// The entity named by the request does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The entity exists already or refuses the operation in its current state.
    #[error("{0}")]
    Conflict(String),
    /// A dependency (provider, browser, model) is not configured or not reachable.
    #[error("{0}")]
    Unavailable(String),
    /// A limit on concurrent work (turns, runs) is reached; try again later.
    #[error("{0}")]
    Busy(String),
    /// A per-method rate limit (env.set, env.list) was reached: -32000.
    #[error("{0}")]
    RateLimited(String),
    /// Anything else; the text goes to the log only.
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<sqlx::Error> for GatewayError {
    /// A database that cannot be reached (PostgreSQL down or restarting, the pool exhausted
    /// past `store.acquireTimeoutMs`) is a dependency being unavailable: -32003 / 503, so clients
    /// retry. Anything else is internal. The detail is logged, never sent.
    fn from(e: sqlx::Error) -> Self {
        if storage_unreachable(&e) {
            tracing::warn!(error = %e, "storage unavailable");
            return Self::Unavailable("storage is unavailable; try again".into());
        }
        Self::Internal(format!("storage: {e}"))
    }
}

fn storage_unreachable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Io(_) => true,
        sqlx::Error::Tls(_) | sqlx::Error::WorkerCrashed => true,
        // SQLSTATE class 08 (connection exception), 57P01-57P03 (the server is shutting down or
        // starting), 53300 (too many connections).
        sqlx::Error::Database(d) => d.code().is_some_and(|c| {
            c.starts_with("08") || matches!(&*c, "57P01" | "57P02" | "57P03" | "53300")
        }),
        _ => false,
    }
}

impl GatewayError {
    /// The one wording of a missing record: `<What> not found: <id>` (what clients and tests
    /// match on, the same for every kind of record).
    pub fn not_found(what: &str, id: impl std::fmt::Display) -> Self {
        Self::NotFound(format!("{what} not found: {id}"))
    }

    /// A missing record of a kind the catalogue's ownership rule names, in the words the
    /// ownership check answers with (`Session not found: <id>`).
    pub fn record_not_found(
        kind: crate::api::generated::methods::RecordKind,
        id: impl std::fmt::Display,
    ) -> Self {
        Self::NotFound(format!("{}: {id}", kind.not_found()))
    }
}
