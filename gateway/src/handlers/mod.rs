//! One module per namespace, each implementing its generated trait on [`Rpc`].

mod config;
mod gateway;
mod system;

use std::sync::Arc;

use crate::state::AppState;

/// The handler set the generated dispatch calls.
#[derive(Clone)]
pub struct Rpc {
    state: Arc<AppState>,
}

impl Rpc {
    pub fn new(state: Arc<AppState>) -> Self {
        Self { state }
    }
}
