//! "Would this configuration build": the one check `check-config`, `gateway.restart` and the
//! configuration writes share, so they agree.

use crate::api::error::GatewayError;
use crate::config::Config;
use crate::runtime::engine::Engine;
use crate::store::Store;

/// The checks a configuration must pass before a generation is built on it, besides those of
/// loading: providers, agents, models and the default agent (a dry run of the engine on an
/// in-memory database) and the webhook routes. `check-config` and `gateway.restart` run it, so
/// the two agree; no data directory is touched. A restart passes the running generation's
/// store (`current`): providers and agents created through the API count as they would at
/// startup, where `check-config` judges the file alone.
pub async fn check(config: &Config, current: Option<&Store>) -> Result<(), String> {
    Engine::check(config, current).await.map_err(|e| match e {
        GatewayError::Internal(m) => m,
        other => other.to_string(),
    })?;
    crate::webhooks::Webhooks::new(&config.webhooks).map_err(|e| e.to_string())?;
    Ok(())
}
