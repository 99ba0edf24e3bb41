//! One module per namespace, each implementing its generated trait on [`Rpc`].

mod admin;
mod agent;
mod agents;
mod auth;
mod autonomy;
mod capabilities;
mod config;
mod context;
mod cron;
mod daemon;
mod env;
mod gateway;
mod graph;
mod heartbeat;
mod lease;
mod memory;

pub(crate) use memory::{search as memory_search, stats as memory_stats};
mod models;
mod obs;
mod providers;
mod run;
mod scheduler;
mod secrets;
mod session;
mod subagent;
mod system;
mod tokens;
mod workspace;

use std::sync::Arc;

use crate::app::state::AppState;
use crate::runtime::engine::Engine;

/// The handler set the generated dispatch calls.
#[derive(Clone)]
pub struct Rpc {
    state: Arc<AppState>,
}

impl Rpc {
    pub fn new(state: Arc<AppState>) -> Self {
        Self { state }
    }

    /// The agent engine of this server generation.
    pub(crate) fn engine(&self) -> &Arc<Engine> {
        &self.state.engine
    }
}

impl crate::api::generated::handlers::Handlers for Rpc {
    type Owners = crate::store::Store;

    fn owners(&self) -> &crate::store::Store {
        &self.state.engine.store
    }
}
