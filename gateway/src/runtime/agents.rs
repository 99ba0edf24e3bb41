//! The agents in force: settings resolved against the model catalogue, the suspended flag,
//! and the default agent. Changes persist first and then replace the in-memory copy, so the
//! next turn sees them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use crate::api::error::GatewayError;
use crate::config::agents::{AgentBudget, AgentSettings};
use crate::config::engine::AgentDefaults;
use crate::providers::registry::{seed_hash, to_json, Snapshot};
use crate::store::registry::Table;
use crate::store::Store;

/// Operations an agent can route to a model other than its primary.
pub const OPERATIONS: &[&str] = &["summarize", "embed", "memory"];

/// One agent in force. `config` has every member set.
#[derive(Debug, Clone, PartialEq)]
pub struct Agent {
    pub id: String,
    pub config: AgentSettings,
    pub suspended: bool,
    pub created_at: i64,
    pub updated_at: i64,
}

impl Agent {
    pub fn model(&self) -> &str {
        self.config.model.as_deref().unwrap_or_default()
    }

    pub fn max_steps(&self) -> u32 {
        self.config.max_steps.unwrap_or(1).clamp(1, 1000) as u32
    }

    pub fn budget(&self) -> AgentBudget {
        self.config.budget.clone().unwrap_or_default()
    }

    /// Whether the agent may call a tool.
    pub fn allows_tool(&self, name: &str) -> bool {
        self.allows_tool_in(name, None)
    }

    /// Whether the agent's `tools` list allows `name`: by name; by `*` unless the tool belongs
    /// to an opt-in `group` (such a tool needs its name or `group:<group>`).
    pub fn allows_tool_in(&self, name: &str, group: Option<&str>) -> bool {
        self.config.tools.as_ref().is_some_and(|t| {
            t.iter().any(|x| {
                x == name
                    || match group {
                        None => x == "*",
                        Some(g) => x.strip_prefix("group:") == Some(g),
                    }
            })
        })
    }

    /// The model configured for an operation, if any.
    pub fn operation_model(&self, op: &str) -> Option<&str> {
        self.config
            .operation_models
            .as_ref()
            .and_then(|m| m.get(op))
            .map(String::as_str)
    }
}

/// An agent's workspace directory.
pub fn workspace_dir(data_dir: &Path, id: &str) -> PathBuf {
    data_dir.join("workspaces").join(id)
}

/// Checks a model reference against the catalogue; the full id.
fn check_model(snap: &Snapshot, what: &str, name: &str) -> Result<String, GatewayError> {
    match snap.model(name) {
        Some(m) if m.id() == name => Ok(m.id()),
        Some(m) => Err(GatewayError::InvalidParams(format!(
            "'{what}': use the full model id {}, not {name}",
            m.id()
        ))),
        None => Err(GatewayError::InvalidParams(format!(
            "'{what}': unknown model {name} (see models.list)"
        ))),
    }
}

/// Fills in defaults and validates an agent's settings against the catalogue.
pub fn complete(
    mut c: AgentSettings,
    id: &str,
    snap: &Snapshot,
    defaults: &AgentDefaults,
    default_model: Option<&str>,
) -> Result<AgentSettings, GatewayError> {
    c.name.get_or_insert_with(|| id.to_owned());
    let model = match (&c.model, &c.provider) {
        (Some(m), _) => m.clone(),
        (None, Some(p)) => snap
            .models
            .iter()
            .find(|m| {
                &m.provider == p && m.can(crate::api::generated::types::ModelsCapability::Chat)
            })
            .map(|m| m.id())
            .ok_or_else(|| {
                GatewayError::InvalidParams(format!("'config.provider': {p} offers no chat model"))
            })?,
        (None, None) => default_model.map(str::to_owned).ok_or_else(|| {
            GatewayError::InvalidParams(
                "'config.model' is required: no default model exists".into(),
            )
        })?,
    };
    let model = check_model(snap, "config.model", &model)?;
    let provider = model
        .split_once('/')
        .map(|(p, _)| p.to_owned())
        .unwrap_or_default();
    if let Some(p) = &c.provider {
        if p != &provider {
            return Err(GatewayError::InvalidParams(format!(
                "'config.provider' {p} does not serve 'config.model' {model}"
            )));
        }
    }
    c.model = Some(model);
    c.provider = Some(provider);
    c.system_prompt.get_or_insert_with(String::new);
    c.max_steps
        .get_or_insert(i64::from(defaults.max_steps.max(1)));
    c.budget.get_or_insert_with(AgentBudget::default);
    c.tools.get_or_insert_with(|| vec!["*".to_owned()]);
    let fallbacks = c.fallback_models.take().unwrap_or_default();
    let mut checked = Vec::with_capacity(fallbacks.len());
    for (i, f) in fallbacks.iter().enumerate() {
        checked.push(check_model(
            snap,
            &format!("config.fallbackModels[{i}]"),
            f,
        )?);
    }
    c.fallback_models = Some(checked);
    let ops = c.operation_models.take().unwrap_or_default();
    let mut routed = BTreeMap::new();
    for (op, m) in ops {
        if !OPERATIONS.contains(&op.as_str()) {
            return Err(GatewayError::InvalidParams(format!(
                "'config.operationModels.{op}': unknown operation (summarize, embed, memory)"
            )));
        }
        let full = check_model(snap, &format!("config.operationModels.{op}"), &m)?;
        routed.insert(op, full);
    }
    c.operation_models = Some(routed);
    Ok(c)
}

fn merge_agent(mut c: AgentSettings, d: AgentSettings) -> AgentSettings {
    if d.name.is_some() {
        c.name = d.name;
    }
    match (d.model, d.provider) {
        (Some(m), p) => {
            c.model = Some(m);
            c.provider = p;
        }
        (None, Some(p)) => {
            c.provider = Some(p);
            c.model = None;
        }
        (None, None) => {}
    }
    if d.system_prompt.is_some() {
        c.system_prompt = d.system_prompt;
    }
    if d.max_steps.is_some() {
        c.max_steps = d.max_steps;
    }
    if d.budget.is_some() {
        c.budget = d.budget;
    }
    if d.tools.is_some() {
        c.tools = d.tools;
    }
    if d.fallback_models.is_some() {
        c.fallback_models = d.fallback_models;
    }
    if d.operation_models.is_some() {
        c.operation_models = d.operation_models;
    }
    if d.heartbeat.is_some() {
        c.heartbeat = d.heartbeat;
    }
    c
}

/// The agent set.
pub struct Agents {
    store: Store,
    defaults: AgentDefaults,
    configured_default: Option<String>,
    map: RwLock<BTreeMap<String, Arc<Agent>>>,
    write: tokio::sync::Mutex<()>,
}

impl Agents {
    pub fn new(store: Store, defaults: AgentDefaults, configured_default: Option<String>) -> Self {
        Self {
            store,
            defaults,
            configured_default,
            map: RwLock::new(BTreeMap::new()),
            write: tokio::sync::Mutex::new(()),
        }
    }

    pub fn defaults(&self) -> &AgentDefaults {
        &self.defaults
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, Arc<Agent>>> {
        self.map.read().unwrap_or_else(|p| p.into_inner())
    }

    pub fn get(&self, id: &str) -> Option<Arc<Agent>> {
        self.read().get(id).cloned()
    }

    /// Like `get`, NotFound naming the agent.
    pub fn require(&self, id: &str) -> Result<Arc<Agent>, GatewayError> {
        self.get(id)
            .ok_or_else(|| GatewayError::not_found("Agent", id))
    }

    pub fn ids(&self) -> Vec<String> {
        self.read().keys().cloned().collect()
    }

    pub fn all(&self) -> Vec<Arc<Agent>> {
        self.read().values().cloned().collect()
    }

    /// The agent `id`, or the default agent when None; -32003 when no agent is configured.
    pub fn require_or_default(&self, id: Option<&str>) -> Result<Arc<Agent>, GatewayError> {
        match id {
            Some(id) => self.require(id),
            None => {
                let id = self
                    .default_id()
                    .ok_or_else(|| GatewayError::Unavailable("No agent is configured".into()))?;
                self.require(&id)
            }
        }
    }

    /// The configured default when it exists, else `default`, else the first id.
    pub fn default_id(&self) -> Option<String> {
        let map = self.read();
        self.configured_default
            .as_ref()
            .filter(|d| map.contains_key(*d))
            .cloned()
            .or_else(|| map.contains_key("default").then(|| "default".to_owned()))
            .or_else(|| map.keys().next().cloned())
    }

    /// Reloads every agent from the database.
    pub async fn reload(&self) -> Result<(), GatewayError> {
        let rows = self.store.registry_list(Table::Agents).await?;
        let mut map = BTreeMap::new();
        for r in rows {
            match serde_json::from_str::<AgentSettings>(&r.config) {
                Ok(config) => {
                    map.insert(
                        r.id.clone(),
                        Arc::new(Agent {
                            id: r.id,
                            config,
                            suspended: r.suspended,
                            created_at: r.created_at,
                            updated_at: r.updated_at,
                        }),
                    );
                }
                Err(e) => {
                    tracing::error!(agent = %r.id, error = %e, "stored agent settings unreadable; skipped")
                }
            }
        }
        match self.map.write() {
            Ok(mut m) => *m = map,
            Err(p) => *p.into_inner() = map,
        }
        Ok(())
    }

    pub async fn create(
        &self,
        id: &str,
        config: AgentSettings,
        snap: &Snapshot,
        default_model: Option<&str>,
    ) -> Result<Arc<Agent>, GatewayError> {
        let config = complete(config, id, snap, &self.defaults, default_model)?;
        let _w = self.write.lock().await;
        if !self
            .store
            .registry_insert(Table::Agents, id, &to_json(&config)?, None)
            .await?
        {
            return Err(GatewayError::Conflict(format!(
                "Agent already exists: {id}"
            )));
        }
        self.reload().await?;
        self.require(id)
    }

    /// The merged settings (validated); saved unless `dry_run`.
    pub async fn update(
        &self,
        id: &str,
        change: AgentSettings,
        snap: &Snapshot,
        dry_run: bool,
    ) -> Result<Agent, GatewayError> {
        let _w = self.write.lock().await;
        let current = self.require(id)?;
        let merged = complete(
            merge_agent(current.config.clone(), change),
            id,
            snap,
            &self.defaults,
            None,
        )?;
        if dry_run {
            return Ok(Agent {
                config: merged,
                ..(*current).clone()
            });
        }
        self.store
            .registry_update(Table::Agents, id, &to_json(&merged)?, None)
            .await?;
        self.reload().await?;
        Ok((*self.require(id)?).clone())
    }

    pub async fn delete(&self, id: &str) -> Result<(), GatewayError> {
        let _w = self.write.lock().await;
        self.require(id)?;
        if self.default_id().as_deref() == Some(id) {
            return Err(GatewayError::Conflict(format!(
                "Agent {id} is the default agent and cannot be deleted"
            )));
        }
        self.store.registry_delete(Table::Agents, id).await?;
        self.reload().await
    }

    /// Sets the suspended flag; whether it changed.
    pub async fn set_suspended(&self, id: &str, suspended: bool) -> Result<bool, GatewayError> {
        let _w = self.write.lock().await;
        let changed = self
            .store
            .agent_set_suspended(id, suspended)
            .await?
            .ok_or_else(|| GatewayError::not_found("Agent", id))?;
        self.reload().await?;
        Ok(changed)
    }

    /// Writes a configuration-file agent (same rules as providers: the file wins when its
    /// entry changed since the last seed).
    pub async fn seed(
        &self,
        id: &str,
        config: &AgentSettings,
        snap: &Snapshot,
        default_model: Option<&str>,
    ) -> Result<(), GatewayError> {
        let hash = seed_hash(config);
        let completed = complete(config.clone(), id, snap, &self.defaults, default_model)
            .map_err(|e| GatewayError::InvalidParams(format!("agents.{id}: {e}")))?;
        let text = to_json(&completed)?;
        self.store
            .registry_seed(Table::Agents, id, &text, &hash)
            .await
    }
}
