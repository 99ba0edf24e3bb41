//! The providers in force: their stored settings, live instances and the model catalogue
//! derived from them. Changes persist first, then swap in a new snapshot, so they take effect
//! for the next model call without a restart.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::api::error::GatewayError;
use crate::config::agents::{ProviderSettings, ProviderType};
use crate::config::engine::ModelConfig;
use crate::config::provider_policy::ProviderPolicyConfig;
use crate::providers::local::{LocalProvider, LocalStatus};
use crate::providers::models::{self, ModelInfo};
use crate::providers::policy::ApiPolicy;
use crate::providers::{
    anthropic::AnthropicProvider, openai::OpenAiProvider, scripted::ScriptedProvider, Provider,
    ProviderKind,
};
use crate::store::registry::{RegistryRow, Table};
use crate::store::Store;

pub const DEFAULT_TIMEOUT_MS: i64 = 60_000;
pub const DEFAULT_MAX_RETRIES: i64 = 2;

impl From<ProviderType> for ProviderKind {
    fn from(t: ProviderType) -> Self {
        match t {
            ProviderType::Openai => Self::Openai,
            ProviderType::Anthropic => Self::Anthropic,
            ProviderType::Local => Self::Local,
            ProviderType::Scripted => Self::Scripted,
        }
    }
}

/// One provider in force.
pub struct ProviderEntry {
    pub id: String,
    pub kind: ProviderKind,
    /// Stored settings with every default filled in.
    pub config: ProviderSettings,
    /// The live instance, or why it could not be built.
    pub instance: Result<Arc<dyn Provider>, String>,
    pub key_configured: bool,
}

impl ProviderEntry {
    pub fn enabled(&self) -> bool {
        self.config.enabled.unwrap_or(true)
    }

    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.config.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS).max(1) as u64)
    }

    pub fn max_retries(&self) -> u32 {
        self.config
            .max_retries
            .unwrap_or(DEFAULT_MAX_RETRIES)
            .max(0) as u32
    }
}

/// Providers and catalogue at one moment.
#[derive(Default)]
pub struct Snapshot {
    pub providers: BTreeMap<String, Arc<ProviderEntry>>,
    pub models: Vec<ModelInfo>,
}

impl Snapshot {
    pub fn model(&self, name: &str) -> Option<&ModelInfo> {
        models::resolve(&self.models, name)
    }
}

/// Default model ids of a provider type that lists none.
fn default_models(kind: ProviderKind) -> Vec<String> {
    let ids: &[&str] = match kind {
        ProviderKind::Local => &[
            crate::providers::local::CHAT_MODEL_ID,
            crate::config::engine::EMBED_MODEL_ID,
        ],
        ProviderKind::Scripted => &["echo"],
        ProviderKind::Openai => &["gpt-4o-mini"],
        ProviderKind::Anthropic => &["claude-sonnet-4-5"],
    };
    ids.iter().map(|s| (*s).to_owned()).collect()
}

/// Fills in every default of a provider's settings and checks rules the schema cannot.
pub fn complete(id: &str, mut c: ProviderSettings) -> Result<ProviderSettings, GatewayError> {
    let Some(t) = c.type_ else {
        return Err(GatewayError::InvalidParams(
            "'config.type' is required (openai, anthropic, local, scripted)".into(),
        ));
    };
    let kind = ProviderKind::from(t);
    if c.script.is_some() && kind != ProviderKind::Scripted {
        return Err(GatewayError::InvalidParams(
            "'config.script' is only for providers of type scripted".into(),
        ));
    }
    if let Some(u) = &c.base_url {
        let ok = url::Url::parse(u).is_ok_and(|u| matches!(u.scheme(), "http" | "https"));
        if !ok {
            return Err(GatewayError::InvalidParams(format!(
                "'config.baseUrl' must be an http or https URL, got {u:?}"
            )));
        }
    }
    c.name.get_or_insert_with(|| id.to_owned());
    c.timeout_ms.get_or_insert(DEFAULT_TIMEOUT_MS);
    c.max_retries.get_or_insert(DEFAULT_MAX_RETRIES);
    c.enabled.get_or_insert(true);
    if c.models.as_ref().is_none_or(Vec::is_empty) {
        c.models = Some(default_models(kind));
    }
    if kind == ProviderKind::Anthropic && c.api_key_env.is_none() {
        c.api_key_env = Some("ANTHROPIC_API_KEY".into());
    }
    if kind == ProviderKind::Openai && c.api_key_env.is_none() && c.base_url.is_none() {
        c.api_key_env = Some("OPENAI_API_KEY".into());
    }
    Ok(c)
}

fn build_entry(
    id: &str,
    config: ProviderSettings,
    local: &Arc<LocalProvider>,
    address_guard: Option<Arc<crate::net::NetPolicy>>,
    secrets: Option<&crate::secrets::Secrets>,
) -> ProviderEntry {
    let kind = ProviderKind::from(config.type_.unwrap_or(ProviderType::Openai));
    // `apiKeyEnv` names a stored secret first, then a variable of the environment.
    let api_key = config
        .api_key_env
        .as_deref()
        .and_then(|v| match secrets {
            Some(s) => s.resolve(v),
            None => std::env::var(v).ok(),
        })
        .filter(|k| !k.trim().is_empty());
    let key_configured = config.api_key_env.is_none() || api_key.is_some();
    // The connection settings of an HTTP provider (a `ProviderConnection`, not the stored `ProviderSettings`).
    let settings = crate::providers::ProviderConnection {
        id: id.to_owned(),
        kind,
        base_url: config.base_url.clone(),
        api_key,
        api_key_env: config.api_key_env.clone(),
        timeout: Duration::from_millis(config.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS) as u64),
        address_guard,
    };
    let instance: Result<Arc<dyn Provider>, String> = match kind {
        ProviderKind::Scripted => Ok(Arc::new(ScriptedProvider::new(
            config.script.clone().unwrap_or_default(),
        ))),
        ProviderKind::Local => Ok(local.clone() as Arc<dyn Provider>),
        ProviderKind::Openai => OpenAiProvider::new(settings)
            .map(|p| Arc::new(p) as Arc<dyn Provider>)
            .map_err(|e| e.message),
        ProviderKind::Anthropic => AnthropicProvider::new(settings)
            .map(|p| Arc::new(p) as Arc<dyn Provider>)
            .map_err(|e| e.message),
    };
    ProviderEntry {
        id: id.to_owned(),
        kind,
        config,
        instance,
        key_configured,
    }
}

/// The provider set, its persistence and its catalogue.
pub struct Providers {
    store: Store,
    overrides: Vec<ModelConfig>,
    local: Arc<LocalProvider>,
    preload_local: bool,
    snapshot: RwLock<Arc<Snapshot>>,
    /// Serialises changes (persist, then swap).
    write: tokio::sync::Mutex<()>,
    /// What create/update may set; the file's providers bind their key variables to their
    /// endpoints ([`Providers::trust_file`]).
    policy: RwLock<ApiPolicy>,
    /// The base URL each provider of the configuration file names ([`Providers::trust_file`]):
    /// any other one in force was set through the API, and its addresses are checked again at
    /// every connection.
    file_urls: RwLock<BTreeMap<String, Option<String>>>,
    /// Where `apiKeyEnv` names are resolved (stored secrets, then the environment); None in a
    /// dry run, which reads the environment only.
    secrets: Option<Arc<crate::secrets::Secrets>>,
}

impl Providers {
    pub fn new(
        store: Store,
        overrides: Vec<ModelConfig>,
        local: Arc<LocalProvider>,
        preload_local: bool,
        policy: &ProviderPolicyConfig,
        secrets: Option<Arc<crate::secrets::Secrets>>,
    ) -> Self {
        Self {
            store,
            overrides,
            local,
            preload_local,
            snapshot: RwLock::new(Arc::new(Snapshot::default())),
            write: tokio::sync::Mutex::new(()),
            policy: RwLock::new(ApiPolicy::new(policy)),
            file_urls: RwLock::default(),
            secrets,
        }
    }

    /// The connection-time address check of a provider whose base URL is not the file's.
    fn address_guard(
        &self,
        id: &str,
        config: &ProviderSettings,
    ) -> Option<Arc<crate::net::NetPolicy>> {
        let from_file = self
            .file_urls
            .read()
            .map(|f| f.get(id) == Some(&config.base_url))
            .unwrap_or(false);
        (!from_file).then(|| Arc::new(self.policy().net().clone()))
    }

    fn policy(&self) -> ApiPolicy {
        self.policy
            .read()
            .map(|p| p.clone())
            .unwrap_or_else(|p| p.into_inner().clone())
    }

    /// Takes what the configuration file allows the API from the file's own providers (the
    /// embedded one when it names none): each key variable bound to the base URL the file
    /// sends it to, and the base URLs that need no address check at connection time. Called
    /// with the file as read for this generation, never with a document an API write changed.
    pub fn trust_file(
        &self,
        file: &BTreeMap<String, ProviderSettings>,
        embedded: (&str, &ProviderSettings),
    ) {
        let mut policy = self.policy();
        let mut urls = BTreeMap::new();
        let entries: Vec<(&str, &ProviderSettings)> = if file.is_empty() {
            vec![embedded]
        } else {
            file.iter().map(|(id, c)| (id.as_str(), c)).collect()
        };
        for (id, cfg) in entries {
            let Ok(completed) = complete(id, cfg.clone()) else {
                continue;
            };
            if let Some(var) = &completed.api_key_env {
                policy.bind_env(var, completed.base_url.as_deref());
            }
            urls.insert(id.to_owned(), completed.base_url.clone());
        }
        match self.policy.write() {
            Ok(mut p) => *p = policy,
            Err(p) => *p.into_inner() = policy,
        }
        match self.file_urls.write() {
            Ok(mut f) => *f = urls,
            Err(f) => *f.into_inner() = urls,
        }
    }

    /// Checks a provider entry written through `config.*` as `providers.create/update` would
    /// check it: when it is new, or its key variable or base URL changed, the variable must be
    /// allowed with that base URL and a changed base URL must pass the URL policy.
    pub async fn check_api_entry(
        &self,
        id: &str,
        entry: &ProviderSettings,
        before: Option<&ProviderSettings>,
    ) -> Result<(), GatewayError> {
        let next = complete(id, entry.clone())
            .map_err(|e| GatewayError::InvalidParams(format!("providers.{id}: {e}")))?;
        let before = before.and_then(|b| complete(id, b.clone()).ok());
        let key_changed = before
            .as_ref()
            .is_none_or(|b| b.api_key_env != next.api_key_env);
        let url_changed = before.as_ref().is_none_or(|b| b.base_url != next.base_url);
        if !(key_changed || url_changed) {
            return Ok(());
        }
        self.check_api_settings(
            next.api_key_env.as_deref(),
            next.base_url.as_deref(),
            next.base_url.as_deref().filter(|_| url_changed),
        )
        .await
        .map_err(|e| match e {
            GatewayError::InvalidParams(m) => {
                GatewayError::InvalidParams(format!("providers.{id}: {m}"))
            }
            other => other,
        })
    }

    /// Checks settings made through the API against the policy: the completed `apiKeyEnv`
    /// (the type's default counts too, since it is a variable the call would read) with the
    /// base URL it would be sent to, and a given `baseUrl`.
    async fn check_api_settings(
        &self,
        key_env: Option<&str>,
        key_url: Option<&str>,
        base_url: Option<&str>,
    ) -> Result<(), GatewayError> {
        let policy = self.policy();
        if let Some(var) = key_env {
            policy
                .check_key_env(var, key_url)
                .map_err(GatewayError::InvalidParams)?;
        }
        if let Some(url) = base_url {
            policy
                .check_base_url(url)
                .await
                .map_err(GatewayError::InvalidParams)?;
        }
        Ok(())
    }

    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot
            .read()
            .map(|s| s.clone())
            .unwrap_or_else(|p| p.into_inner().clone())
    }

    /// Whether a model can be called now (provider enabled, key present, instance built, and
    /// for the local provider: loaded).
    pub fn available(&self, snap: &Snapshot, m: &ModelInfo) -> bool {
        snap.providers.get(&m.provider).is_some_and(|p| {
            p.enabled()
                && p.key_configured
                && p.instance.is_ok()
                && (p.kind != ProviderKind::Local || self.local.status() == LocalStatus::Ready)
        })
    }

    /// Starts loading the local models when nothing started them yet (`local.preload:
    /// false`), and waits for them up to `wait`.
    pub async fn ensure_local(&self, wait: Duration) {
        if self.local.status() == LocalStatus::NotStarted {
            self.local.start();
        }
        if let Err(e) = self.local.wait_ready(wait).await {
            tracing::debug!(error = %e, "local models not ready");
        }
    }

    /// Rebuilds the snapshot from the database.
    pub async fn reload(&self) -> Result<(), GatewayError> {
        let rows = self.store.registry_list(Table::Providers).await?;
        let mut providers = BTreeMap::new();
        let mut models = Vec::new();
        for RegistryRow { id, config, .. } in rows {
            let cfg: ProviderSettings = match serde_json::from_str(&config) {
                Ok(c) => c,
                Err(e) => {
                    tracing::error!(provider = %id, error = %e, "stored provider settings unreadable; skipped");
                    continue;
                }
            };
            let guard = self.address_guard(&id, &cfg);
            let entry = build_entry(&id, cfg, &self.local, guard, self.secrets.as_deref());
            models.extend(models::models_of(
                &id,
                entry.kind,
                entry.config.models.as_deref().unwrap_or_default(),
                &self.overrides,
            ));
            providers.insert(id, Arc::new(entry));
        }
        models.sort_by_key(|m| m.id());
        if self.preload_local
            && providers
                .values()
                .any(|p| p.kind == ProviderKind::Local && p.enabled())
            && self.local.status() == LocalStatus::NotStarted
        {
            self.local.start();
        }
        let snap = Arc::new(Snapshot { providers, models });
        match self.snapshot.write() {
            Ok(mut s) => *s = snap,
            Err(p) => *p.into_inner() = snap,
        }
        Ok(())
    }

    /// Adds a provider; Conflict when the id exists.
    pub async fn create(&self, id: &str, config: ProviderSettings) -> Result<(), GatewayError> {
        let config = complete(id, config)?;
        self.check_api_settings(
            config.api_key_env.as_deref(),
            config.base_url.as_deref(),
            config.base_url.as_deref(),
        )
        .await?;
        let _w = self.write.lock().await;
        let text = to_json(&config)?;
        if !self
            .store
            .registry_insert(Table::Providers, id, &text, None)
            .await?
        {
            return Err(GatewayError::Conflict(format!(
                "Provider already exists: {id}"
            )));
        }
        self.reload().await
    }

    /// Merges a change into a provider's settings.
    pub async fn update(&self, id: &str, change: ProviderSettings) -> Result<(), GatewayError> {
        let _w = self.write.lock().await;
        let current = self
            .snapshot()
            .providers
            .get(id)
            .map(|p| p.config.clone())
            .ok_or_else(|| GatewayError::not_found("Provider", id))?;
        if change.type_.is_some_and(|t| Some(t) != current.type_) {
            return Err(GatewayError::Conflict(format!(
                "The type of provider {id} cannot change; delete it and create a new one"
            )));
        }
        let (key_changed, url_changed) = (change.api_key_env.is_some(), change.base_url.is_some());
        let merged = complete(id, merge_provider(current, change))?;
        // A changed base URL checks the key again: a key stays bound to its endpoint.
        self.check_api_settings(
            merged
                .api_key_env
                .as_deref()
                .filter(|_| key_changed || url_changed),
            merged.base_url.as_deref(),
            merged.base_url.as_deref().filter(|_| url_changed),
        )
        .await?;
        self.store
            .registry_update(Table::Providers, id, &to_json(&merged)?, None)
            .await?;
        self.reload().await
    }

    /// Sets `enabled`; None when unknown, Some(changed).
    pub async fn set_enabled(&self, id: &str, enabled: bool) -> Result<bool, GatewayError> {
        let _w = self.write.lock().await;
        let mut current = self
            .snapshot()
            .providers
            .get(id)
            .map(|p| p.config.clone())
            .ok_or_else(|| GatewayError::not_found("Provider", id))?;
        if current.enabled == Some(enabled) {
            return Ok(false);
        }
        current.enabled = Some(enabled);
        self.store
            .registry_update(Table::Providers, id, &to_json(&current)?, None)
            .await?;
        self.reload().await?;
        Ok(true)
    }

    pub async fn delete(&self, id: &str) -> Result<(), GatewayError> {
        let _w = self.write.lock().await;
        if !self.store.registry_delete(Table::Providers, id).await? {
            return Err(GatewayError::not_found("Provider", id));
        }
        self.reload().await
    }

    /// Writes a configuration-file entry: inserted when new, replaced when the file's entry
    /// changed since it was last seeded, kept (with changes made through the API) otherwise.
    pub async fn seed(&self, id: &str, config: &ProviderSettings) -> Result<(), GatewayError> {
        let hash = seed_hash(config);
        let completed = complete(id, config.clone())
            .map_err(|e| GatewayError::InvalidParams(format!("providers.{id}: {e}")))?;
        let text = to_json(&completed)?;
        self.store
            .registry_seed(Table::Providers, id, &text, &hash)
            .await
    }
}

fn merge_provider(mut c: ProviderSettings, d: ProviderSettings) -> ProviderSettings {
    if d.name.is_some() {
        c.name = d.name;
    }
    if d.base_url.is_some() {
        c.base_url = d.base_url;
    }
    if d.api_key_env.is_some() {
        c.api_key_env = d.api_key_env;
    }
    if d.timeout_ms.is_some() {
        c.timeout_ms = d.timeout_ms;
    }
    if d.max_retries.is_some() {
        c.max_retries = d.max_retries;
    }
    if d.enabled.is_some() {
        c.enabled = d.enabled;
    }
    if d.models.is_some() {
        c.models = d.models;
    }
    if d.script.is_some() {
        c.script = d.script;
    }
    c
}

pub fn to_json<T: serde::Serialize>(v: &T) -> Result<String, GatewayError> {
    serde_json::to_string(v).map_err(|e| GatewayError::Internal(format!("encode settings: {e}")))
}

/// SHA-256 of an entry's canonical JSON.
pub fn seed_hash<T: serde::Serialize>(v: &T) -> String {
    use sha2::{Digest, Sha256};
    let text = serde_json::to_string(v).unwrap_or_default();
    Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
