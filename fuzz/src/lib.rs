//! The fuzz crate's library: the properties every target checks (shared with the CI harness).
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

pub mod props;

use std::sync::LazyLock;

/// One runtime for the async targets; the rigs it builds live as long as the fuzzing process.
pub static RUNTIME: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("tokio runtime")
});
