//! Graph workflows (`graph.*`, docs/graphs.md): checking definitions, running them as the root
//! of a run tree, and the live state of the runs this node executes.

pub mod definition;
mod exec;
pub mod expr;
pub mod template;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::api::error::GatewayError;
use crate::api::generated::types::{GraphNodeRun, GraphRunStatus, GraphRunSummary};
use crate::api::tenancy::Tenant;
use crate::api::CallContext;
use crate::config::graphs::GraphsConfig;
use crate::runtime::agents::Agents;
use crate::runtime::control::Control;
use crate::runtime::runs::Runs;
use crate::runtime::tree::LiveRun;
use crate::runtime::turn::Turns;
use crate::store::graphs::GraphRunRow;
use crate::store::Store;
use definition::{Checked, Def, Env, Source};

/// Longest output a node keeps; longer ones are cut there.
pub const MAX_NODE_OUTPUT: usize = 256 * 1024;
/// How long `graph.cancel` waits for the run to end.
const CANCEL_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// A file a node saved (`save_file`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Artifact {
    pub filename: String,
    pub media_id: String,
    pub size_bytes: i64,
}

/// One node's state, as kept live and stored (`graph_runs.nodes`, in execution order).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeState {
    pub node_id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    #[serde(default)]
    pub attempts: u32,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub artifacts: Vec<Artifact>,
}

impl NodeState {
    /// Milliseconds between its start and its end, once both are known.
    pub fn duration_ms(&self) -> Option<i64> {
        Some(self.completed_at? - self.started_at?).filter(|d| *d >= 0)
    }

    /// As `graph.status` lists it.
    pub fn to_wire(&self) -> Result<GraphNodeRun, GatewayError> {
        Ok(GraphNodeRun {
            node_id: self.node_id.clone(),
            type_: wire_enum(&self.kind)?,
            status: wire_enum(&self.status)?,
            started_at: self.started_at,
            completed_at: self.completed_at,
            error: self.error.clone(),
        })
    }
}

/// A stored enum string as its generated type.
pub fn wire_enum<T: serde::de::DeserializeOwned>(s: &str) -> Result<T, GatewayError> {
    serde_json::from_value(json!(s))
        .map_err(|_| GatewayError::Internal(format!("unexpected stored value {s}")))
}

/// A graph run as stored: its summary and its nodes.
pub fn summary_of(row: &GraphRunRow) -> Result<GraphRunSummary, GatewayError> {
    Ok(GraphRunSummary {
        run_id: row.run_id.clone(),
        definition_id: row.definition_id.clone(),
        label: row.label.clone(),
        status: wire_enum(&row.status)?,
        node_count: row.node_count,
        completed_nodes: row.completed_nodes,
        failed_nodes: row.failed_nodes,
        artifact_count: row.artifact_count,
        created_at: row.created_at,
        started_at: row.started_at,
        completed_at: row.completed_at,
        duration_ms: row
            .completed_at
            .zip(row.started_at)
            .map(|(c, s)| (c - s).max(0)),
        error: row.error.clone(),
    })
}

/// The stored nodes of a run (an unreadable record reads as none). In a run that ended
/// without its executor (its process died: the orphan sweep ended it), a node the record last
/// saw pending or running never finished: it reads `cancelled`.
pub fn nodes_of(row: &GraphRunRow) -> Vec<NodeState> {
    let mut nodes: Vec<NodeState> = serde_json::from_str(&row.nodes).unwrap_or_default();
    if is_final(&row.status) {
        for n in nodes.iter_mut().filter(|n| !is_final(&n.status)) {
            n.status = "cancelled".to_owned();
        }
    }
    nodes
}

/// Whether a stored status is final.
pub fn is_final(status: &str) -> bool {
    !matches!(status, "pending" | "running")
}

/// An event payload without its null members (absent, as the catalogue's optional members).
pub(crate) fn without_nulls(mut v: serde_json::Value) -> serde_json::Value {
    if let Some(map) = v.as_object_mut() {
        map.retain(|_, v| !v.is_null());
    }
    v
}

/// A run this node executes.
pub struct Execution {
    pub def: Arc<Def>,
    /// The summary row (its `nodes` member is written only when stored).
    row: Mutex<GraphRunRow>,
    /// Per node, in the definition's order.
    nodes: Mutex<Vec<NodeState>>,
    /// `graph.cancel`.
    cancel: CancellationToken,
    /// The run's root in the run tree: agent nodes run below it, tool nodes on its lease.
    pub root: Arc<LiveRun>,
    done: tokio::sync::watch::Sender<bool>,
}

impl Execution {
    /// The summary and every node in execution order, as the run stands.
    /// The counters are the nodes' as they stand.
    pub fn snapshot(&self) -> (GraphRunRow, Vec<NodeState>) {
        let mut row = self.row.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let nodes = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
        let count = |status: &str| nodes.iter().filter(|n| n.status == status).count() as i64;
        row.completed_nodes = count("completed");
        row.failed_nodes = count("failed");
        row.artifact_count = nodes.iter().map(|n| n.artifacts.len() as i64).sum();
        let ordered = self.def.order.iter().map(|&i| nodes[i].clone()).collect();
        (row, ordered)
    }

    /// The row to store: the summary with the nodes as JSON.
    fn stored_row(&self) -> GraphRunRow {
        let (mut row, nodes) = self.snapshot();
        row.nodes = serde_json::to_string(&nodes).unwrap_or_else(|_| "[]".to_owned());
        row
    }

    async fn ended(&self) {
        let mut rx = self.done.subscribe();
        let _ = rx.wait_for(|d| *d).await;
    }
}

/// Graph runs on this node, and what checking and starting them needs.
pub struct Graphs {
    store: Store,
    agents: Arc<Agents>,
    turns: Arc<Turns>,
    runs: Arc<Runs>,
    control: Arc<Control>,
    config: GraphsConfig,
    live: Mutex<HashMap<String, Arc<Execution>>>,
}

/// Answer of a cancel.
pub struct Cancelled {
    pub cancelled: bool,
    pub status: GraphRunStatus,
}

impl Graphs {
    pub fn new(
        store: Store,
        agents: Arc<Agents>,
        turns: Arc<Turns>,
        runs: Arc<Runs>,
        control: Arc<Control>,
        config: GraphsConfig,
    ) -> Self {
        Self {
            store,
            agents,
            turns,
            runs,
            control,
            config,
            live: Mutex::new(HashMap::new()),
        }
    }

    pub fn config(&self) -> &GraphsConfig {
        &self.config
    }

    /// What `src` may refer to for `caller`: the configured agents and the tools each agent
    /// it names offers the caller.
    fn env(&self, caller: &CallContext, src: &Source) -> Env {
        let agents: HashSet<String> = self.agents.ids().into_iter().collect();
        let default_agent = self.agents.default_id();
        let mut offered = HashMap::new();
        let named = src
            .agent_id
            .iter()
            .chain(src.nodes.iter().filter_map(|n| n.agent_id.as_ref()))
            .chain(default_agent.iter());
        for id in named {
            if offered.contains_key(id) {
                continue;
            }
            if let Some(agent) = self.agents.get(id) {
                let tools: HashSet<String> = self
                    .turns
                    .tools()
                    .specs(|name, scope, group| {
                        agent.allows_tool_in(name, group) && caller.scopes.allows(scope)
                    })
                    .into_iter()
                    .map(|t| t.name)
                    .collect();
                offered.insert(id.clone(), tools);
            }
        }
        Env {
            agents,
            default_agent,
            offered,
            node_timeout_ms: self.config.node_timeout_ms,
            run_timeout_ms: self.config.run_timeout_ms,
        }
    }

    /// Checks (and compiles) a definition for `caller`.
    pub async fn check(&self, caller: &CallContext, src: Source) -> Result<Checked, GatewayError> {
        let env = self.env(caller, &src);
        expr::on_compile_thread(move || definition::check(&src, &env)).await
    }

    /// The run `run_id` when this node executes it.
    /// `run.kill` of a root that is a graph run held by another node: stores a cancel request
    /// before the kill of its node runs goes out, so the node running it ends the graph
    /// `cancelled` (as `graph.cancel` would) rather than failing it over a killed node.
    pub async fn kill_requested(&self, root: &str) -> Result<(), GatewayError> {
        if self.live(root).is_none() && self.store.is_shared() {
            self.store.graph_run_request_cancel(root).await?;
        }
        Ok(())
    }

    pub fn live(&self, run_id: &str) -> Option<Arc<Execution>> {
        self.lock().get(run_id).cloned()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Execution>>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts a run of `def` for `caller` (its owner) and answers its first row; the run goes
    /// on in the background. -32002 past `graphs.maxLiveRunsPerOwner`.
    pub async fn start(
        self: &Arc<Self>,
        caller: &CallContext,
        def: Arc<Def>,
        definition_id: Option<String>,
        variables: BTreeMap<String, String>,
    ) -> Result<GraphRunRow, GatewayError> {
        let live_runs = self.store.graph_runs_live_count(&caller.client_id).await?;
        if live_runs >= i64::from(self.config.max_live_runs_per_owner) {
            return Err(GatewayError::Conflict(format!(
                "Too many graph runs: {live_runs} are live (graphs.maxLiveRunsPerOwner); wait for one to end"
            )));
        }
        let run_id = format!("graph_{}", uuid::Uuid::new_v4().simple());
        let agent_id = def
            .agent_id
            .clone()
            .or_else(|| self.agents.default_id())
            .unwrap_or_default();
        let root = self
            .runs
            .register_root(&run_id, &agent_id, &caller.client_id, caller.scopes);
        let now = crate::clock::now_ms();
        let row = GraphRunRow {
            run_id: run_id.clone(),
            owner: caller.client_id.clone(),
            definition_id,
            label: def.label.clone(),
            status: "running".to_owned(),
            node_count: def.nodes.len() as i64,
            created_at: now,
            started_at: Some(now),
            ..GraphRunRow::default()
        };
        let nodes = def
            .nodes
            .iter()
            .map(|n| NodeState {
                node_id: n.id.clone(),
                kind: n.kind.as_str().to_owned(),
                status: "pending".to_owned(),
                started_at: None,
                completed_at: None,
                error: None,
                output: None,
                attempts: 0,
                artifacts: Vec::new(),
            })
            .collect();
        let ex = Arc::new(Execution {
            def,
            row: Mutex::new(row),
            nodes: Mutex::new(nodes),
            cancel: CancellationToken::new(),
            root,
            done: tokio::sync::watch::channel(false).0,
        });
        let first = ex.stored_row();
        if let Err(e) = self.store.graph_run_insert(&first).await {
            self.runs.tree().finish(&ex.root, None);
            return Err(e);
        }
        self.lock().insert(run_id.clone(), ex.clone());
        self.control.events.publish_owned(
            Some(Arc::from(caller.client_id.as_str())),
            "graph:started",
            without_nulls(json!({
                "runId": run_id,
                "definitionId": first.definition_id,
                "label": first.label,
                "nodeCount": first.node_count,
            })),
        );
        let graphs = self.clone();
        let caller = caller.clone();
        #[allow(
            clippy::disallowed_methods,
            reason = "a graph run ends with its executor (its timeout, a cancel or a kill); its row records the outcome"
        )]
        tokio::spawn(async move {
            exec::drive(&graphs, &ex, caller, variables).await;
            graphs.lock().remove(&ex.root.run_id);
            let _ = ex.done.send(true);
        });
        Ok(first)
    }

    /// Cancels a run wherever it runs: here at once, on another node through its stored
    /// request. Waits (at most 2 s) for it to end. None when `tenant` reaches no such run.
    pub async fn cancel(
        &self,
        tenant: &Tenant,
        run_id: &str,
    ) -> Result<Option<Cancelled>, GatewayError> {
        let Some(row) = self.store.graph_run_get(tenant, run_id).await? else {
            return Ok(None);
        };
        if is_final(&row.status) {
            return Ok(Some(Cancelled {
                cancelled: false,
                status: wire_enum(&row.status)?,
            }));
        }
        if let Some(ex) = self.live(run_id) {
            ex.cancel.cancel();
            let _ = tokio::time::timeout(CANCEL_WAIT, ex.ended()).await;
        } else if self.store.graph_run_request_cancel(run_id).await?.is_some() {
            let deadline = tokio::time::Instant::now() + CANCEL_WAIT;
            while tokio::time::Instant::now() < deadline {
                match self.store.graph_run_get(tenant, run_id).await? {
                    Some(r) if !is_final(&r.status) => {}
                    _ => break,
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
        let status = match self.store.graph_run_get(tenant, run_id).await? {
            Some(r) => wire_enum(&r.status)?,
            None => GraphRunStatus::Cancelled,
        };
        Ok(Some(Cancelled {
            cancelled: true,
            status,
        }))
    }
}
