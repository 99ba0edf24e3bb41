//! What one server generation shares between its routes and handlers.

use std::path::PathBuf;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::auth::TokenStore;
use crate::config::Config;
use crate::hub::Hub;
use crate::runtime::engine::Engine;
use crate::transport::limits::RateLimiter;

use crate::runtime::control::Control;

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
    /// This node's configuration file as read for this generation (an empty object without
    /// one): where the file-only keys come from (`config::trust`).
    pub file_document: serde_json::Value,
    /// The history commit of the fleet's configuration document this generation runs (None
    /// before one was stored); the fleet follower compares it with the store's.
    pub config_sha: std::sync::Mutex<Option<String>>,
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
            file_document: serde_json::Value::Object(Default::default()),
            config_sha: std::sync::Mutex::new(None),
        }
    }

    /// The fleet document's commit this generation runs.
    pub fn config_sha(&self) -> Option<String> {
        self.config_sha
            .lock()
            .map(|s| s.clone())
            .unwrap_or_else(|p| p.into_inner().clone())
    }

    /// Records the fleet document's commit now in force here.
    pub fn set_config_sha(&self, sha: Option<String>) {
        match self.config_sha.lock() {
            Ok(mut s) => *s = sha,
            Err(p) => *p.into_inner() = sha,
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
