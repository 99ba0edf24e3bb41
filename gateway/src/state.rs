//! What one server generation shares between its routes and handlers.

use std::path::PathBuf;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::auth::TokenStore;
use crate::config::Config;
use crate::hub::Hub;
use crate::runtime::engine::Engine;
use crate::transport::limits::RateLimiter;

pub use crate::runtime::control::Control;

pub struct AppState {
    pub config: Config,
    pub config_paths: Vec<PathBuf>,
    pub data_dir: PathBuf,
    pub tokens: TokenStore,
    pub http_limiter: RateLimiter,
    /// Cancelled when this generation stops (shutdown or restart): WebSockets close with 1001.
    pub stop: CancellationToken,
    /// 1 for the first server instance, +1 per in-process restart.
    pub generation: u64,
    pub control: Arc<Control>,
    /// The agent engine (storage, providers, agents).
    pub engine: Arc<Engine>,
    /// Webhook routes (None when `webhooks.enabled` is false).
    pub webhooks: Option<Arc<crate::webhooks::Webhooks>>,
    /// The configuration in force as `config.read` shows it: `config` plus the changes applied
    /// live since this generation started (agents, providers).
    live: std::sync::RwLock<Arc<Config>>,
}

impl AppState {
    pub fn new(
        config: Config,
        config_paths: Vec<PathBuf>,
        data_dir: PathBuf,
        tokens: TokenStore,
        generation: u64,
        control: Arc<Control>,
        engine: Arc<Engine>,
    ) -> Self {
        let http_limiter = RateLimiter::from_config(&config.gateway);
        let live = std::sync::RwLock::new(Arc::new(config.clone()));
        Self {
            live,
            config,
            config_paths,
            data_dir,
            tokens,
            http_limiter,
            stop: CancellationToken::new(),
            generation,
            control,
            engine,
            webhooks: None,
        }
    }

    /// The configuration in force (see `live`).
    pub fn live_config(&self) -> Arc<Config> {
        self.live
            .read()
            .map(|c| c.clone())
            .unwrap_or_else(|p| p.into_inner().clone())
    }

    /// Records a change applied live.
    pub fn set_live_config(&self, config: Config) {
        if let Ok(mut c) = self.live.write() {
            *c = Arc::new(config);
        }
    }

    /// Open WebSocket connections and server push.
    pub fn hub(&self) -> &Hub {
        &self.control.hub
    }

    /// Seconds since the process started.
    pub fn uptime(&self) -> f64 {
        self.control.process_start.elapsed().as_secs_f64()
    }
}
