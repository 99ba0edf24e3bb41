//! The integration suite, one test binary (each former test file is a module here, so the
//! crate and its dependencies are linked once instead of once per file). Run one part with
//! `cargo test --test suite <module>::`, e.g. `cargo test --test suite e2e_agents::`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod autobahn;
mod common;
mod contract;
mod e2e_admin_boundary;
mod e2e_admission;
mod e2e_agents;
mod e2e_conn;
mod e2e_context;
mod e2e_control;
mod e2e_failures;
mod e2e_hardening;
mod e2e_http;
mod e2e_limits;
mod e2e_local;
mod e2e_media;
mod e2e_memory;
mod e2e_memory_limits;
mod e2e_metrics;
mod e2e_multinode;
mod e2e_obs;
mod e2e_owners;
mod e2e_process;
mod e2e_restart;
mod e2e_revocation;
mod e2e_rpc;
mod e2e_scheduler;
mod e2e_tenancy;
mod e2e_transfer;
mod e2e_webhooks;
mod e2e_workspace;
mod fuzz_harness;
mod local_model;
mod pg;
mod providers_http;
