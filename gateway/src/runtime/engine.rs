//! The agent engine of one server generation: storage, providers and catalogue, agents,
//! tools, session locks and background runs, seeded from the configuration file.

use std::path::PathBuf;
use std::sync::Arc;

use crate::api::error::GatewayError;
use crate::api::generated::methods::MethodId;
use crate::api::generated::types::{
    self as wire, AgentsCreateParams, ModelsCapability, ProvidersCreateParams,
};
use crate::api::invoke;
use crate::config::agents::{AgentSettings, ProviderSettings, ProviderType};
use crate::config::Config;
use crate::providers::local::{self, LocalOptions, LocalProvider};
use crate::providers::registry::Providers;
use crate::runtime::agents::Agents;
use crate::runtime::calls::ModelCalls;
use crate::runtime::control::Control;
use crate::runtime::memory::{Memory, MemoryState};
use crate::runtime::runs::Runs;
use crate::runtime::scheduler::Scheduler;
use crate::runtime::turn::Turns;
use crate::store::registry::Table;
use crate::store::Store;

/// `AGENT_GATEWAY_NO_FETCH=1` turns `local.autoFetch` off (tests, air-gapped hosts).
pub const ENV_NO_FETCH: &str = "AGENT_GATEWAY_NO_FETCH";

/// Id of the provider defined when the configuration names none.
pub const EMBEDDED_PROVIDER: &str = "local";
/// Id of the agent defined when the configuration names none.
pub const EMBEDDED_AGENT: &str = "default";

/// The services of a generation the engine works with, opened by the composition root.
pub struct Services {
    pub store: Store,
    pub secrets: Arc<crate::secrets::Secrets>,
    pub api_tokens: Arc<crate::auth::ApiTokens>,
    pub media: Arc<crate::media::MediaStore>,
    pub obs: Arc<crate::obs::ObsState>,
    pub memory: Arc<MemoryState>,
}

/// The engine of one server generation: a plain bundle of its registries and of the services
/// over them (model calls, memory, turns, runs, scheduler), each holding exactly the handles
/// it uses. Handlers and routes reach everything through it; nothing in it points back at it.
pub struct Engine {
    pub store: Store,
    pub providers: Arc<Providers>,
    pub agents: Arc<Agents>,
    pub data_dir: PathBuf,
    pub control: Arc<Control>,
    /// Files saved by agents and tools (`<dataDir>/media`), served under /media/.
    pub media: Arc<crate::media::MediaStore>,
    /// Stored secrets and the resolver of secret names.
    pub secrets: Arc<crate::secrets::Secrets>,
    /// The API tokens of the store (checked on every request with the file's).
    pub api_tokens: Arc<crate::auth::ApiTokens>,
    /// Observability settings and the last context budget per agent.
    pub obs: Arc<crate::obs::ObsState>,
    /// Chat steps and embeddings, with their usage rows.
    pub calls: ModelCalls,
    /// Long-term memory: writes, recall, consolidation (its state: index, caches, breaker).
    pub memory: Arc<Memory>,
    /// Agent turns and the conversations' summary trees.
    pub turns: Arc<Turns>,
    /// Background runs (session.spawn, session.send, webhooks, scheduled turns).
    pub runs: Arc<Runs>,
    /// Tool calls waiting for an operator (`autonomy.approvals`).
    pub approvals: Arc<crate::runtime::approvals::Approvals>,
    /// Cron jobs and heartbeats.
    pub scheduler: Arc<Scheduler>,
    /// Graph workflows (`graph.*`).
    pub graphs: Arc<crate::runtime::graph::Graphs>,
    /// Agents' workspace files (`workspace.*`).
    pub workspaces: Arc<crate::runtime::workspace::Workspaces>,
}

/// The media store's directory under the data directory.
pub const MEDIA_DIR: &str = "media";

/// Where and how the local models are fetched, from the configuration and environment.
pub fn local_options(config: &Config) -> LocalOptions {
    let l = &config.local;
    let cache_dir = std::env::var_os(local::ENV_MODEL_CACHE)
        .map(PathBuf::from)
        .or_else(|| l.cache_dir.clone())
        .unwrap_or_else(local::default_cache_dir);
    let no_fetch = std::env::var(ENV_NO_FETCH).is_ok_and(|v| v == "1");
    LocalOptions {
        cache_dir,
        auto_fetch: l.auto_fetch && !no_fetch,
        python: l.python.clone(),
        threads: l.threads,
    }
}

/// The process-wide local provider (model loading outlives server generations).
pub fn local_provider(config: &Config, control: &Control) -> Arc<LocalProvider> {
    control
        .local
        .get_or_init(|| LocalProvider::new(local_options(config)))
        .clone()
}

/// Validates a configuration-file entry with the same schema as the RPC method taking it.
fn check_entry<T: serde::de::DeserializeOwned>(
    method: MethodId,
    value: serde_json::Value,
    what: &str,
) -> Result<T, GatewayError> {
    invoke::parse_params(method.info(), Some(value))
        .map_err(|e| GatewayError::InvalidParams(format!("{what}: {}", e.message)))
}

impl Engine {
    /// Publishes a system-wide event (`/api/events`, `/api/activity`).
    pub fn emit<T: serde::Serialize + Send + Sync + 'static>(&self, name: &'static str, data: T) {
        self.control.events.publish(name, data);
    }

    /// Publishes an event of `owner`'s session: only that tenant (and admin) sees it.
    pub fn emit_owned<T: serde::Serialize + Send + Sync + 'static>(
        &self,
        owner: &std::sync::Arc<str>,
        name: &'static str,
        data: T,
    ) {
        self.control.events.publish_to(owner, name, data);
    }

    /// Publishes an operator-only event (`audit:event`, `secret:*`): owned by
    /// [`crate::api::principal::OPERATOR`], an id no token has, so only admin sees it.
    pub fn emit_operator<T: serde::Serialize + Send + Sync + 'static>(
        &self,
        name: &'static str,
        data: T,
    ) {
        self.control.events.publish_owned(
            Some(std::sync::Arc::from(crate::api::principal::OPERATOR)),
            name,
            data,
        );
    }

    /// [`Engine::emit_owned`] when there is an owner, else [`Engine::emit`].
    pub fn emit_for<T: serde::Serialize + Send + Sync + 'static>(
        &self,
        owner: Option<&std::sync::Arc<str>>,
        name: &'static str,
        data: T,
    ) {
        self.control
            .events
            .publish_owned(owner.cloned(), name, data);
    }
}

impl Engine {
    /// The engine of a generation on the services the composition root (`server.rs`) opened
    /// for it, seeding providers and agents from `config` (the configuration in force: the
    /// fleet's document on this node's file). What the API may set for providers comes from
    /// `file`, this node's configuration file as read, never from a document an API write
    /// changed.
    pub async fn new(
        services: Services,
        config: &Config,
        file: &Config,
        data_dir: PathBuf,
        control: Arc<Control>,
    ) -> Result<Self, GatewayError> {
        let Services {
            store,
            secrets,
            api_tokens,
            media,
            obs,
            memory,
        } = services;
        let local = local_provider(config, &control);
        let providers = Arc::new(Providers::new(
            store.clone(),
            config.models.clone(),
            local,
            config.local.preload,
            &config.provider_policy,
            Some(secrets.clone()),
        ));
        let agents = Arc::new(Agents::new(
            store.clone(),
            config.agent_defaults.clone(),
            config.default_agent.clone(),
        ));
        let calls = ModelCalls::new(store.clone(), providers.clone(), control.clone());
        let memory = Arc::new(Memory::new(
            memory,
            store.clone(),
            agents.clone(),
            calls.clone(),
            control.clone(),
        ));
        let approvals = Arc::new(crate::runtime::approvals::Approvals::new(
            store.clone(),
            control.clone(),
            &config.autonomy.approvals,
        ));
        let turns = Arc::new(Turns::new(
            store.clone(),
            providers.clone(),
            agents.clone(),
            media.clone(),
            obs.clone(),
            control.clone(),
            calls.clone(),
            memory.clone(),
            approvals.clone(),
        ));
        let runs = Arc::new(Runs::new(
            store.clone(),
            agents.clone(),
            control.clone(),
            turns.clone(),
            config.autonomy.clone(),
        ));
        turns.attach_runs(&runs);
        if store.is_shared() {
            runs.watch_remote();
        }
        let scheduler = Arc::new(Scheduler::new(
            config.scheduler.clone(),
            store.clone(),
            agents.clone(),
            providers.clone(),
            control.clone(),
            runs.clone(),
            data_dir.clone(),
            file.agents
                .iter()
                .filter(|(_, a)| a.admin_trust == Some(true))
                .map(|(id, _)| id.clone())
                .collect(),
        ));
        let graphs = Arc::new(crate::runtime::graph::Graphs::new(
            store.clone(),
            agents.clone(),
            turns.clone(),
            runs.clone(),
            control.clone(),
            config.graphs.clone(),
        ));
        let workspaces = Arc::new(crate::runtime::workspace::Workspaces::new(
            data_dir.clone(),
            agents.clone(),
            config.workspaces.private_paths.clone(),
        ));
        let engine = Self {
            store,
            providers,
            agents,
            data_dir,
            control,
            media,
            secrets,
            api_tokens,
            obs,
            calls,
            memory,
            turns,
            runs,
            approvals,
            scheduler,
            graphs,
            workspaces,
        };
        engine
            .providers
            .trust_file(&file.providers, (EMBEDDED_PROVIDER, &embedded_provider()));
        engine.seed(config).await?;
        engine.scheduler.seed_jobs().await?;
        Ok(engine)
    }

    /// The checks `open` makes of a configuration (every provider and agent entry, models,
    /// the default agent), run on an in-memory database: no data directory is touched and no
    /// model is loaded or fetched. What `check-config` and a restart run first. `current` is
    /// the running generation's store: its providers and agents (those created through the
    /// API too) are copied first, so that the dry run sees what `open` would see.
    pub async fn check(config: &Config, current: Option<&Store>) -> Result<(), GatewayError> {
        let store = Store::open_in_memory().await?;
        if let Some(current) = current {
            for table in [Table::Providers, Table::Agents] {
                for row in current.registry_list(table).await? {
                    store
                        .registry_insert(table, &row.id, &row.config, row.seed_hash.as_deref())
                        .await?;
                }
            }
        }
        let (providers, agents) = dry_registries(&store, config);
        seed(&providers, &agents, config).await?;
        crate::runtime::scheduler::jobs::check_config_jobs(&agents, &config.scheduler.jobs)
    }

    /// Seeds the providers and agents of `config` (a changed file entry wins over the stored
    /// one) and checks the default agent: at open, and when a configuration write changes
    /// only those sections (applied live).
    pub async fn seed_from(&self, config: &Config) -> Result<(), GatewayError> {
        self.seed(config).await
    }

    async fn seed(&self, config: &Config) -> Result<(), GatewayError> {
        seed(&self.providers, &self.agents, config).await
    }

    /// The first chat model of the catalogue: the embedded local model when present.
    pub fn default_chat_model(&self) -> Option<String> {
        default_chat_model(&self.providers)
    }
}

/// Registries over `store` for a dry run (`check-config`, tests): the local provider is
/// described but never loaded.
fn dry_registries(store: &Store, config: &Config) -> (Providers, Agents) {
    let providers = Providers::new(
        store.clone(),
        config.models.clone(),
        LocalProvider::new(local_options(config)),
        false,
        &config.provider_policy,
        None,
    );
    let agents = Agents::new(
        store.clone(),
        config.agent_defaults.clone(),
        config.default_agent.clone(),
    );
    (providers, agents)
}

/// Writes the configuration file's providers and agents (or the embedded ones) into the
/// registries, checking each entry, then checks the default agent.
async fn seed(
    registry: &Providers,
    agent_registry: &Agents,
    config: &Config,
) -> Result<(), GatewayError> {
    let mut providers = config.providers.clone();
    if providers.is_empty() {
        providers.insert(EMBEDDED_PROVIDER.to_owned(), embedded_provider());
    }
    for (id, cfg) in &providers {
        // The file gets the catalogue's constraints: the entry is checked in its wire form,
        // whatever the catalogue calls its members today.
        check_entry::<ProvidersCreateParams>(
            MethodId::ProvidersCreate,
            serde_json::json!({"providerId": id, "config": wire::ProvidersConfig::from(cfg.clone())}),
            &format!("providers.{id}"),
        )?;
        registry.seed(id, cfg).await?;
    }
    registry.reload().await?;
    let snap = registry.snapshot();
    let default_model = default_chat_model(registry);
    let mut agents = config.agents.clone();
    if agents.is_empty() {
        agents.insert(EMBEDDED_AGENT.to_owned(), embedded_agent());
    }
    for (id, cfg) in &agents {
        check_entry::<AgentsCreateParams>(
            MethodId::AgentsCreate,
            serde_json::json!({"agentId": id, "config": wire::AgentsConfig::from(cfg.clone())}),
            &format!("agents.{id}"),
        )?;
        if let Some(h) = &cfg.heartbeat {
            crate::runtime::scheduler::beat::check(id, h)
                .map_err(|e| GatewayError::InvalidParams(format!("agents.{id}.heartbeat.{e}")))?;
        }
        agent_registry
            .seed(id, cfg, &snap, default_model.as_deref())
            .await?;
    }
    agent_registry.reload().await?;
    if let Some(d) = &config.default_agent {
        if agent_registry.get(d).is_none() {
            return Err(GatewayError::InvalidParams(format!(
                "defaultAgent: no agent {d}"
            )));
        }
    }
    Ok(())
}

/// The provider defined when the configuration names none.
fn embedded_provider() -> ProviderSettings {
    ProviderSettings {
        type_: Some(ProviderType::Local),
        name: Some("In-process models (candle)".to_owned()),
        timeout_ms: Some(300_000),
        max_retries: Some(0),
        ..ProviderSettings::default()
    }
}

/// The agent defined when the configuration names none (on the first chat model).
fn embedded_agent() -> AgentSettings {
    AgentSettings {
        name: Some("Default agent".to_owned()),
        system_prompt: Some("You are a helpful assistant. Answer briefly.".to_owned()),
        ..AgentSettings::default()
    }
}

/// The first chat model of the catalogue: the embedded local model when present.
fn default_chat_model(providers: &Providers) -> Option<String> {
    let snap = providers.snapshot();
    let local = format!("{EMBEDDED_PROVIDER}/{}", local::CHAT_MODEL_ID);
    if snap.model(&local).is_some() {
        return Some(local);
    }
    snap.models
        .iter()
        .find(|m| m.can(ModelsCapability::Chat))
        .map(|m| m.id())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use crate::config::agents::tests::{
        AGENT_JSON, AGENT_SEED_HASH, CONFIG_YAML, PROVIDER_JSON, PROVIDER_SEED_HASH,
    };
    use crate::store::registry::RegistryRow;

    /// Seeds `config` into an in-memory database; the rows of both tables.
    async fn seeded(config: &Config) -> Result<(Vec<RegistryRow>, Vec<RegistryRow>), GatewayError> {
        let store = Store::open_in_memory().await?;
        let (providers, agents) = dry_registries(&store, config);
        seed(&providers, &agents, config).await?;
        Ok((
            store.registry_list(Table::Providers).await?,
            store.registry_list(Table::Agents).await?,
        ))
    }

    /// The turn service runs on exactly the handles it is given, with no engine around it: a
    /// scripted turn on a stored session answers, and its transcript and usage row land in the
    /// store it holds; a background run of the run service does the same through it.
    #[tokio::test]
    async fn the_turn_and_run_services_work_on_their_own_handles() {
        let config = crate::config::parse(
            "providers:\n  p:\n    type: scripted\n    models: [echo]\n    script:\n      \
             - steps:\n          - reply: Hello from the script.\n\
             agents:\n  a:\n    model: p/echo\n",
        )
        .unwrap();
        let store = Store::open_in_memory().await.unwrap();
        let (providers, agents) = dry_registries(&store, &config);
        seed(&providers, &agents, &config).await.unwrap();
        let (providers, agents) = (Arc::new(providers), Arc::new(agents));
        let control = Arc::new(Control::new());
        let media_dir = tempfile::tempdir().unwrap();
        let media = Arc::new(
            crate::media::MediaStore::open(media_dir.path().to_path_buf(), None, 1 << 20)
                .await
                .unwrap(),
        );
        let calls = ModelCalls::new(store.clone(), providers.clone(), control.clone());
        let memory = Arc::new(Memory::new(
            MemoryState::new(config.memory.clone()),
            store.clone(),
            agents.clone(),
            calls.clone(),
            control.clone(),
        ));
        let turns = Arc::new(Turns::new(
            store.clone(),
            providers,
            agents.clone(),
            media,
            crate::obs::ObsState::new(config.observability.clone()),
            control.clone(),
            calls,
            memory,
            Arc::new(crate::runtime::approvals::Approvals::new(
                store.clone(),
                control.clone(),
                &config.autonomy.approvals,
            )),
        ));
        let caller = crate::api::principal::Principal::internal("tenant-1").context(None);
        let agent = agents.require("a").unwrap();
        let key = crate::store::sessions::session_key("a", "api", "tenant-1", "u");
        let session = || {
            crate::runtime::sessions::SessionIdent::stored(
                key.clone(),
                "a".into(),
                "api".into(),
                "tenant-1".into(),
                "u".into(),
            )
        };
        let out = turns
            .run_turn(crate::runtime::turn::TurnRequest {
                session: Some(session()),
                ..crate::runtime::turn::TurnRequest::new(agent.clone(), "hi".into(), &caller)
            })
            .await
            .unwrap();
        assert_eq!(out.response, "Hello from the script.");
        let reach = crate::api::tenancy::Tenant::owner("tenant-1");
        let (rows, _) = store
            .session_messages(&reach, &key, None, 10)
            .await
            .unwrap();
        assert_eq!(
            rows.len(),
            2,
            "the user's message and the answer are stored"
        );
        store.usage_flush().await.unwrap();

        let runs = Arc::new(Runs::new(
            store.clone(),
            agents,
            control,
            turns,
            config.autonomy.clone(),
        ));
        let started = runs
            .start_run(crate::runtime::runs::RunSpec::new(
                agent,
                session(),
                "again".into(),
                &caller,
            ))
            .await
            .unwrap();
        let (row, outcome) = started.done.await.unwrap();
        assert_eq!(row.status, "completed");
        assert_eq!(outcome.unwrap().response, "Hello from the script.");
        let (rows, _) = store
            .session_messages(&reach, &key, None, 10)
            .await
            .unwrap();
        assert_eq!(rows.len(), 4);
    }

    #[tokio::test]
    async fn seeding_stores_todays_text_and_seed_hash() {
        let config = crate::config::parse(CONFIG_YAML).unwrap();
        let (providers, agents) = seeded(&config).await.unwrap();
        assert_eq!(providers.len(), 1);
        assert_eq!(providers[0].id, "demo");
        assert_eq!(providers[0].config, PROVIDER_JSON);
        assert_eq!(providers[0].seed_hash.as_deref(), Some(PROVIDER_SEED_HASH));
        assert_eq!(agents.len(), 1);
        assert_eq!(agents[0].id, "bot");
        assert_eq!(agents[0].config, AGENT_JSON);
        assert_eq!(agents[0].seed_hash.as_deref(), Some(AGENT_SEED_HASH));
    }

    /// The embedded defaults are seeded on every start without a `providers`/`agents`
    /// section; their hashes were computed on `main` at 779c347 (the then inline
    /// `ProvidersConfig`/`AgentsConfig` literals, printed by a temporary test), so an
    /// existing data directory is not re-seeded by the refactor.
    #[tokio::test]
    async fn the_embedded_defaults_keep_their_text_and_seed_hash() {
        let (providers, agents) = seeded(&Config::default()).await.unwrap();
        assert_eq!(providers.len(), 1);
        assert_eq!(providers[0].id, EMBEDDED_PROVIDER);
        assert_eq!(
            providers[0].seed_hash.as_deref(),
            Some("4409e05783c748f2ae75615439afeef6cd5b2a491afc34873dd6cb95725cc91b")
        );
        assert_eq!(
            crate::providers::registry::to_json(&embedded_provider()).unwrap(),
            r#"{"type":"local","name":"In-process models (candle)","timeoutMs":300000,"maxRetries":0}"#
        );
        assert_eq!(agents.len(), 1);
        assert_eq!(agents[0].id, EMBEDDED_AGENT);
        assert_eq!(
            agents[0].seed_hash.as_deref(),
            Some("2c210b44ec837df0378b1e133c10995637e6b500fcca3018aba3896c301ca401")
        );
    }

    /// The file's entries get the catalogue's constraints through the wire conversion: at
    /// the limit accepted, one past it refused naming the entry and the member.
    #[tokio::test]
    async fn file_entries_are_checked_against_the_catalogue_schema() {
        let provider = |timeout: i64| {
            format!("providers:\n  p:\n    type: scripted\n    timeoutMs: {timeout}\n")
        };
        // The catalogue's minimum of providers' timeoutMs is 1000.
        let ok = crate::config::parse(&provider(1000)).unwrap();
        seeded(&ok).await.unwrap();
        let bad = crate::config::parse(&provider(999)).unwrap();
        let e = seeded(&bad).await.unwrap_err().to_string();
        assert!(e.contains("providers.p") && e.contains("timeoutMs"), "{e}");

        let agent = |steps: i64| {
            format!("providers:\n  p:\n    type: scripted\nagents:\n  a:\n    maxSteps: {steps}\n")
        };
        // ... and the minimum of agents' maxSteps is 1.
        seeded(&crate::config::parse(&agent(1)).unwrap())
            .await
            .unwrap();
        let e = seeded(&crate::config::parse(&agent(0)).unwrap())
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("agents.a") && e.contains("maxSteps"), "{e}");

        // A raw key where the variable's name belongs (the catalogue's pattern).
        let key = "providers:\n  p:\n    type: openai\n    apiKeyEnv: sk-abc def\n";
        let e = seeded(&crate::config::parse(key).unwrap())
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("providers.p") && e.contains("apiKeyEnv"), "{e}");
    }
}
