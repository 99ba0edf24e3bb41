//! The integration suite, one test binary (each former test file is a module here, so the
//! crate and its dependencies are linked once instead of once per file). The modules are
//! grouped by area in folders (see README.md); `common` and `pg` are the shared helpers. Run
//! one area or module with `cargo test --test suite -- <area>::[<module>::]`, e.g.
//! `cargo test --test suite -- rpc::` or `cargo test --test suite -- engine::e2e_agents::`.
#![allow(
    clippy::disallowed_methods,
    reason = "tests and benches own the tasks they start"
)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
mod pg;

mod contract;
mod engine;
mod fleet;
mod http;
mod ops;
mod rpc;
mod store;
