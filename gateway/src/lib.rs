//! agent-gateway: one authenticated, documented front door for a fleet of AI agents.
//! JSON-RPC over WebSocket (/ws) and HTTP (/rpc), generated from the method catalogue.

// Tests own the tasks they start (clippy.toml forbids bare spawns in production code only).
#![cfg_attr(test, allow(clippy::disallowed_methods))]

pub mod api;
pub mod app;
pub mod auth;
pub mod clock;
pub mod config;
pub mod events;
pub mod fanout;
pub mod handlers;
pub mod http;
pub mod hub;
pub mod logging;
pub mod media;
pub mod metrics;
pub mod net;
pub mod obs;
pub mod proc;
pub mod providers;
pub mod rpc;
pub mod runtime;
pub mod secrets;
pub mod server;
pub mod store;
pub mod transport;
pub mod webhooks;
