//! What outlives a server generation (the process-wide control block): the restart requests,
//! the push hub, the event bus, the local model, the scheduler's re-arm signal and fire
//! slots, and turn admission. The engine
//! and the server generations both hold it; it depends on neither.

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use tokio::sync::Notify;

use crate::events::EventBus;
use crate::hub::Hub;
use crate::providers::local::LocalProvider;

/// What outlives a server generation: the restart request, process start, and the push hub
/// (connections of a stopping generation unregister themselves).
pub struct Control {
    /// Stops the running generation (the server loop signals it once the next one is ready).
    pub restart: Notify,
    pub process_start: Instant,
    /// The same instant as epoch milliseconds (`nodes.started_at`).
    pub started_at_ms: i64,
    pub hub: Arc<Hub>,
    /// The in-process model provider: loaded once per process, shared by every generation.
    pub local: OnceLock<Arc<LocalProvider>>,
    /// System events for /api/events and /api/activity.
    pub events: EventBus,
    /// Bumped by every change that can move the scheduler's earliest due time: each
    /// generation's timer looks at the due times again.
    pub scheduler_epoch: tokio::sync::watch::Sender<u64>,
    /// Fires and heartbeat ticks running on this node.
    pub fire_slots: crate::runtime::scheduler::FireSlots,
    /// Concurrent turns and runs (`gateway.limits`), counted across generations.
    pub admission: crate::runtime::admission::Admission,
    /// Databases this process has opened (their unfinished runs were swept once), by path or
    /// URL.
    opened_databases: std::sync::Mutex<std::collections::BTreeSet<String>>,
    /// This process as a node of the fleet sharing its database (`runs.claimed_by`,
    /// `nodes`): a random id per process, the same for every server generation, so a
    /// generation never takes over the runs an earlier one still runs.
    pub node_id: Arc<str>,
    /// Cross-node fan-out, started once when the database is shared (PostgreSQL).
    pub fanout: OnceLock<crate::fanout::Fanout>,
    /// Bumped when another node changed agents or providers (or this node's notification
    /// connection came back): each generation reloads its registries.
    pub registry_epoch: tokio::sync::watch::Sender<u64>,
    /// `gateway.restart` asks for the next generation here; the server loop builds and checks
    /// it, and only then stops the running one (`restart`).
    pub restart_requested: Notify,
    /// Restarts refused because the configuration would not start (logged each time).
    pub restarts_refused: std::sync::atomic::AtomicU64,
    /// Serialises writes of the configuration file (config.set/patch/apply/rollback).
    pub config_writes: tokio::sync::Mutex<()>,
    /// The spec's per-method rate limits (env.set, env.list).
    pub limits: crate::runtime::method_limits::MethodLimits,
    /// Runs live on this node, across generations (`run.kill` in a new generation reaches a
    /// run an earlier one started), and the spawn pause.
    pub tree: crate::runtime::tree::RunTree,
    /// Approval decisions for the turns waiting on this node, across generations.
    pub approvals: crate::runtime::approvals::Waiters,
    /// Bumped when another node left a stop or a steering message for a run (the runs
    /// service of the running generation looks at once).
    pub runs_epoch: tokio::sync::watch::Sender<u64>,
}

impl Control {
    pub fn new() -> Self {
        Self {
            restart: Notify::new(),
            process_start: Instant::now(),
            started_at_ms: crate::clock::now_ms(),
            hub: Arc::new(Hub::default()),
            local: OnceLock::new(),
            events: EventBus::default(),
            scheduler_epoch: tokio::sync::watch::Sender::new(0),
            fire_slots: Default::default(),
            admission: Default::default(),
            opened_databases: Default::default(),
            node_id: uuid::Uuid::new_v4().simple().to_string().into(),
            fanout: OnceLock::new(),
            registry_epoch: tokio::sync::watch::Sender::new(0),
            restart_requested: Notify::new(),
            restarts_refused: Default::default(),
            config_writes: tokio::sync::Mutex::new(()),
            limits: Default::default(),
            tree: Default::default(),
            approvals: Default::default(),
            runs_epoch: tokio::sync::watch::Sender::new(0),
        }
    }

    /// A notification to every WebSocket connection of `client_id`, on this node and, when
    /// the database is shared, on every other node; how many connections of this node got it.
    pub fn push_client(&self, client_id: &str, method: &str, params: serde_json::Value) -> usize {
        if let Some(fanout) = self.fanout.get() {
            fanout.push(client_id, method, &params);
        }
        self.hub.notify_client(client_id, method, params)
    }

    /// True the first time this process opens the database `key` (a file path or a URL).
    pub fn first_open_of(&self, key: String) -> bool {
        self.opened_databases
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(key)
    }
}

impl Default for Control {
    fn default() -> Self {
        Self::new()
    }
}

/// The fan-out delivers what other nodes send through the control block.
impl crate::fanout::Node for Control {
    fn node_id(&self) -> &Arc<str> {
        &self.node_id
    }

    fn events(&self) -> &EventBus {
        &self.events
    }

    fn hub(&self) -> &Hub {
        &self.hub
    }

    fn announced(&self, what: Option<&str>) {
        if what == Some(crate::runtime::scheduler::ANNOUNCE) {
            crate::runtime::scheduler::rearm(self);
        } else if what == Some(crate::runtime::runs::ANNOUNCE_RUNS) {
            self.runs_epoch.send_modify(|v| *v += 1);
        } else if what == Some(crate::runtime::runs::ANNOUNCE_PAUSED) {
            self.tree.set_paused(true);
        } else if what == Some(crate::runtime::runs::ANNOUNCE_RESUMED) {
            self.tree.set_paused(false);
        } else if let Some(root) =
            what.and_then(|w| w.strip_prefix(crate::runtime::runs::ANNOUNCE_EVICT))
        {
            self.tree.evict(root);
        } else {
            self.registry_epoch.send_modify(|v| *v += 1);
        }
    }

    fn resync(&self) {
        self.registry_epoch.send_modify(|v| *v += 1);
        self.runs_epoch.send_modify(|v| *v += 1);
        crate::runtime::scheduler::rearm(self);
    }
}
