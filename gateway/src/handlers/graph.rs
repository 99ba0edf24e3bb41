//! `graph.*`: graph workflows (docs/graphs.md). The ownership rules (`graph`, `graph_run` in
//! owners.yaml) are checked by the generated dispatch; saved graphs are addressed within the
//! caller's own ids, runs through the caller's tenant.

use std::collections::BTreeMap;

use super::Rpc;
use crate::api::error::GatewayError;
use crate::api::generated::handlers::GraphApi;
use crate::api::generated::types::{
    GraphCancelParams, GraphCancelResult, GraphDefineParams, GraphDefineResult, GraphDefinition,
    GraphDeleteParams, GraphDeleteResult, GraphDeleteRunParams, GraphDeleteRunResult,
    GraphExecuteParams, GraphExecuteResult, GraphListParams, GraphListResult,
    GraphListResultEntriesItem, GraphLoadParams, GraphOutputsParams, GraphOutputsResult,
    GraphOutputsResultSource, GraphRun, GraphRunDetailParams, GraphRunDetailResult,
    GraphRunDetailResultNodesItem, GraphRunDetailResultNodesItemArtifactsItem, GraphRunsParams,
    GraphRunsResult, GraphSaveParams, GraphSaveResult, GraphStatusParams, GraphStatusResult,
};
use crate::api::CallContext;
use crate::runtime::graph::definition::{Checked, Source};
use crate::runtime::graph::{nodes_of, summary_of, wire_enum, NodeState};
use crate::store::graphs::{GraphRow, GraphRunRow, RunDeletion};

/// Largest artifact content `graph.runDetail` inlines (the `save_file` limit).
const MAX_ARTIFACT_BYTES: u64 = 1 << 20;

/// The definition members a saved graph stores (everything but its id, label, agent and
/// times, which are columns).
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Stored {
    nodes: Vec<crate::api::generated::types::GraphNode>,
    edges: Vec<crate::api::generated::types::GraphEdge>,
    on_failure: crate::api::generated::types::GraphOnFailure,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    timeout_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    budget: Option<crate::api::generated::types::GraphBudget>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    settings: Option<crate::api::generated::types::GraphSettings>,
}

fn stored(row: &GraphRow) -> Result<Stored, GatewayError> {
    serde_json::from_str(&row.definition)
        .map_err(|e| GatewayError::Internal(format!("stored graph {} unreadable: {e}", row.id)))
}

/// -32602 naming the first error of a check.
fn refuse_invalid(checked: &Checked) -> Result<(), GatewayError> {
    match checked.errors.first() {
        None => Ok(()),
        Some(first) => Err(GatewayError::InvalidParams(format!(
            "invalid graph definition ({}): {}",
            first.code, first.message
        ))),
    }
}

impl Rpc {
    /// A run as it stands: live on this node, else stored (None: not within reach).
    async fn graph_run_state(
        &self,
        ctx: &CallContext,
        run_id: &str,
    ) -> Result<Option<(GraphRunRow, Vec<NodeState>, bool)>, GatewayError> {
        let engine = self.engine();
        // The graph_run rule has already found the run among the caller's (admin: anyone's).
        if let Some(ex) = engine.graphs.live(run_id) {
            let (row, nodes) = ex.snapshot();
            return Ok(Some((row, nodes, true)));
        }
        Ok(engine
            .store
            .graph_run_get(ctx.tenant(), run_id)
            .await?
            .map(|row| {
                let nodes = nodes_of(&row);
                (row, nodes, false)
            }))
    }

    fn graph_run_wire(row: &GraphRunRow, nodes: &[NodeState]) -> Result<GraphRun, GatewayError> {
        Ok(GraphRun {
            run: summary_of(row)?,
            nodes: nodes
                .iter()
                .map(NodeState::to_wire)
                .collect::<Result<_, _>>()?,
        })
    }
}

fn run_not_found(run_id: &str) -> GatewayError {
    GatewayError::not_found("Graph run", run_id)
}

impl GraphApi for Rpc {
    async fn define(
        &self,
        ctx: &CallContext,
        p: GraphDefineParams,
    ) -> Result<GraphDefineResult, GatewayError> {
        let label = p.label.clone();
        let checked = self
            .engine()
            .graphs
            .check(
                ctx,
                Source {
                    label: p.label,
                    agent_id: None,
                    nodes: p.nodes,
                    edges: p.edges.unwrap_or_default(),
                    on_failure: Some(p.on_failure),
                    timeout_ms: p.timeout_ms,
                    budget: p.budget,
                    settings: p.settings,
                },
            )
            .await?;
        Ok(GraphDefineResult {
            valid: checked.errors.is_empty(),
            node_count: checked.node_count as i64,
            execution_order: checked.order,
            label,
            warnings: checked.warnings,
            errors: checked.errors,
            user_variables: checked.variables,
        })
    }

    async fn execute(
        &self,
        ctx: &CallContext,
        p: GraphExecuteParams,
    ) -> Result<GraphExecuteResult, GatewayError> {
        let engine = self.engine();
        let (src, definition_id) = match (&p.id, p.nodes) {
            (Some(_), Some(_)) => {
                return Err(GatewayError::InvalidParams(
                    "id, nodes: give exactly one (a saved graph or an inline definition)".into(),
                ))
            }
            (None, None) => {
                return Err(GatewayError::InvalidParams(
                    "id, nodes: one is required (a saved graph or an inline definition)".into(),
                ))
            }
            (Some(id), None) => {
                let inline = [
                    ("label", p.label.is_some()),
                    ("edges", p.edges.is_some()),
                    ("timeoutMs", p.timeout_ms.is_some()),
                    ("budget", p.budget.is_some()),
                    ("settings", p.settings.is_some()),
                ];
                if let Some((name, _)) = inline.iter().find(|(_, given)| *given) {
                    return Err(GatewayError::InvalidParams(format!(
                        "{name}: applies only to an inline definition (nodes), not to a saved graph"
                    )));
                }
                let row = engine
                    .store
                    .graph_get(&ctx.client_id, id)
                    .await?
                    .ok_or_else(|| GatewayError::not_found("Graph", id))?;
                let s = stored(&row)?;
                (
                    Source {
                        label: Some(row.label.clone()),
                        agent_id: p.agent_id.clone().or(row.agent_id.clone()),
                        nodes: s.nodes,
                        edges: s.edges,
                        on_failure: Some(s.on_failure),
                        timeout_ms: s.timeout_ms,
                        budget: s.budget,
                        settings: s.settings,
                    },
                    Some(row.id),
                )
            }
            (None, Some(nodes)) => (
                Source {
                    label: p.label,
                    agent_id: p.agent_id.clone(),
                    nodes,
                    edges: p.edges.unwrap_or_default(),
                    on_failure: Some(p.on_failure),
                    timeout_ms: p.timeout_ms,
                    budget: p.budget,
                    settings: p.settings,
                },
                None,
            ),
        };
        let checked = engine.graphs.check(ctx, src).await?;
        refuse_invalid(&checked)?;
        let Some(def) = checked.def else {
            return Err(GatewayError::Internal(
                "a valid graph was not compiled".into(),
            ));
        };
        let variables: BTreeMap<String, String> = p.variables.unwrap_or_default();
        if let Some(missing) = def.variables.iter().find(|v| !variables.contains_key(*v)) {
            return Err(GatewayError::InvalidParams(format!(
                "variables.{missing}: required by the definition ({{{{{missing}}}}})"
            )));
        }
        let mut warnings = checked.warnings;
        for name in variables.keys().filter(|k| !def.variables.contains(k)) {
            warnings.push(crate::api::generated::types::GraphValidationIssue {
                code: "unused_variable".into(),
                message: format!("variable {name} is not used by the definition"),
                node_id: None,
            });
        }
        let row = engine
            .graphs
            .start(ctx, def, definition_id, variables)
            .await?;
        Ok(GraphExecuteResult {
            run_id: row.run_id,
            status: wire_enum(&row.status)?,
            node_count: row.node_count,
            label: row.label,
            warnings,
        })
    }

    async fn status(
        &self,
        ctx: &CallContext,
        p: GraphStatusParams,
    ) -> Result<GraphStatusResult, GatewayError> {
        if let Some(run_id) = &p.run_id {
            let (row, nodes, _) = self
                .graph_run_state(ctx, run_id)
                .await?
                .ok_or_else(|| run_not_found(run_id))?;
            return Ok(GraphStatusResult {
                runs: vec![Self::graph_run_wire(&row, &nodes)?],
            });
        }
        let since = crate::clock::now_ms() - p.recent_minutes.max(1) * 60_000;
        let rows = self
            .engine()
            .store
            .graph_runs_recent(ctx.tenant(), since)
            .await?;
        let mut runs = Vec::with_capacity(rows.len());
        for stored in rows {
            let (row, nodes) = match self.engine().graphs.live(&stored.run_id) {
                Some(ex) => ex.snapshot(),
                None => {
                    let nodes = nodes_of(&stored);
                    (stored, nodes)
                }
            };
            runs.push(Self::graph_run_wire(&row, &nodes)?);
        }
        Ok(GraphStatusResult { runs })
    }

    async fn cancel(
        &self,
        ctx: &CallContext,
        p: GraphCancelParams,
    ) -> Result<GraphCancelResult, GatewayError> {
        let done = self
            .engine()
            .graphs
            .cancel(ctx.tenant(), &p.run_id)
            .await?
            .ok_or_else(|| run_not_found(&p.run_id))?;
        Ok(GraphCancelResult {
            run_id: p.run_id,
            cancelled: done.cancelled,
            status: done.status,
        })
    }

    async fn outputs(
        &self,
        ctx: &CallContext,
        p: GraphOutputsParams,
    ) -> Result<GraphOutputsResult, GatewayError> {
        let (row, nodes, live) = self
            .graph_run_state(ctx, &p.run_id)
            .await?
            .ok_or_else(|| run_not_found(&p.run_id))?;
        Ok(GraphOutputsResult {
            run_id: row.run_id,
            status: wire_enum(&row.status)?,
            outputs: nodes
                .into_iter()
                .filter(|n| n.status == "completed")
                .filter_map(|n| Some((n.node_id, n.output?)))
                .collect(),
            source: if live {
                GraphOutputsResultSource::Live
            } else {
                GraphOutputsResultSource::Stored
            },
        })
    }

    async fn runs(
        &self,
        ctx: &CallContext,
        p: GraphRunsParams,
    ) -> Result<GraphRunsResult, GatewayError> {
        let (rows, total) = self
            .engine()
            .store
            .graph_runs_list(ctx.tenant(), p.limit, p.offset)
            .await?;
        Ok(GraphRunsResult {
            runs: rows.iter().map(summary_of).collect::<Result<_, _>>()?,
            total,
        })
    }

    async fn run_detail(
        &self,
        ctx: &CallContext,
        p: GraphRunDetailParams,
    ) -> Result<GraphRunDetailResult, GatewayError> {
        let engine = self.engine();
        let (row, nodes, _) = self
            .graph_run_state(ctx, &p.run_id)
            .await?
            .ok_or_else(|| run_not_found(&p.run_id))?;
        let now = crate::clock::now_ms();
        let mut out = Vec::with_capacity(nodes.len());
        for n in nodes {
            let mut artifacts = Vec::with_capacity(n.artifacts.len());
            for a in &n.artifacts {
                // A file that expired or was removed is listed without its content.
                let content = match engine.media.get_for(&a.media_id, now, ctx.tenant()).await {
                    Ok(file) if file.meta.size <= MAX_ARTIFACT_BYTES => tokio::fs::read(&file.path)
                        .await
                        .map(|b| String::from_utf8_lossy(&b).into_owned())
                        .unwrap_or_default(),
                    _ => String::new(),
                };
                artifacts.push(GraphRunDetailResultNodesItemArtifactsItem {
                    filename: a.filename.clone(),
                    content,
                    size_bytes: a.size_bytes,
                });
            }
            out.push(GraphRunDetailResultNodesItem {
                duration_ms: n.duration_ms(),
                type_: wire_enum(&n.kind)?,
                status: wire_enum(&n.status)?,
                output: n.output.filter(|_| n.status == "completed"),
                error: n.error,
                node_id: n.node_id,
                artifacts,
            });
        }
        Ok(GraphRunDetailResult {
            run: summary_of(&row)?,
            nodes: out,
        })
    }

    async fn delete_run(
        &self,
        ctx: &CallContext,
        p: GraphDeleteRunParams,
    ) -> Result<GraphDeleteRunResult, GatewayError> {
        let engine = self.engine();
        // The stored row is the truth: a live run's status stays pending or running until its
        // executor stores the final one, and another tenant's run is not within reach.
        let deleted = match engine
            .store
            .graph_run_delete(ctx.tenant(), &p.run_id)
            .await?
        {
            RunDeletion::Deleted => true,
            RunDeletion::Missing => false,
            RunDeletion::Live => {
                return Err(GatewayError::Conflict(format!(
                    "Graph run {} is running; graph.cancel it first",
                    p.run_id
                )))
            }
        };
        Ok(GraphDeleteRunResult {
            run_id: p.run_id,
            deleted,
        })
    }

    async fn save(
        &self,
        ctx: &CallContext,
        p: GraphSaveParams,
    ) -> Result<GraphSaveResult, GatewayError> {
        let engine = self.engine();
        let src = Source {
            label: Some(p.label.clone()),
            agent_id: p.agent_id.clone(),
            nodes: p.nodes.clone(),
            edges: p.edges.clone().unwrap_or_default(),
            on_failure: Some(p.on_failure),
            timeout_ms: p.timeout_ms,
            budget: p.budget.clone(),
            settings: p.settings.clone(),
        };
        let checked = engine.graphs.check(ctx, src).await?;
        refuse_invalid(&checked)?;
        let owner = &ctx.client_id;
        let id =
            p.id.clone()
                .unwrap_or_else(|| format!("graph-{}", uuid::Uuid::new_v4().simple()));
        let exists = engine.store.graph_get(owner, &id).await?;
        if exists.is_none() {
            let held = engine.store.graph_count(owner).await?;
            let max = i64::from(engine.graphs.config().max_saved_per_owner);
            if held >= max {
                return Err(GatewayError::Conflict(format!(
                    "Too many saved graphs: {held} (graphs.maxSavedPerOwner); delete one first"
                )));
            }
        }
        let definition = serde_json::to_string(&Stored {
            nodes: p.nodes,
            edges: p.edges.unwrap_or_default(),
            on_failure: p.on_failure,
            timeout_ms: p.timeout_ms,
            budget: p.budget,
            settings: p.settings,
        })
        .map_err(|e| GatewayError::Internal(e.to_string()))?;
        let now = crate::clock::now_ms();
        let created = engine
            .store
            .graph_save(&GraphRow {
                owner: owner.clone(),
                id: id.clone(),
                label: p.label,
                agent_id: p.agent_id,
                definition,
                node_count: checked.node_count as i64,
                created_at: now,
                updated_at: now,
            })
            .await?;
        Ok(GraphSaveResult {
            id,
            saved: true,
            created,
        })
    }

    async fn load(
        &self,
        ctx: &CallContext,
        p: GraphLoadParams,
    ) -> Result<GraphDefinition, GatewayError> {
        let row = self
            .engine()
            .store
            .graph_get(&ctx.client_id, &p.id)
            .await?
            .ok_or_else(|| GatewayError::not_found("Graph", &p.id))?;
        let s = stored(&row)?;
        Ok(GraphDefinition {
            id: row.id,
            label: row.label,
            agent_id: row.agent_id,
            nodes: s.nodes,
            edges: s.edges,
            on_failure: s.on_failure,
            timeout_ms: s.timeout_ms,
            budget: s.budget,
            settings: s.settings,
            created_at: row.created_at,
            updated_at: row.updated_at,
        })
    }

    async fn list(
        &self,
        ctx: &CallContext,
        p: GraphListParams,
    ) -> Result<GraphListResult, GatewayError> {
        let (rows, total) = self
            .engine()
            .store
            .graph_list(&ctx.client_id, p.limit, p.offset)
            .await?;
        Ok(GraphListResult {
            entries: rows
                .into_iter()
                .map(|r| GraphListResultEntriesItem {
                    id: r.id,
                    label: r.label,
                    agent_id: r.agent_id,
                    node_count: r.node_count,
                    created_at: r.created_at,
                    updated_at: r.updated_at,
                })
                .collect(),
            total,
        })
    }

    async fn delete(
        &self,
        ctx: &CallContext,
        p: GraphDeleteParams,
    ) -> Result<GraphDeleteResult, GatewayError> {
        let deleted = self
            .engine()
            .store
            .graph_delete(&ctx.client_id, &p.id)
            .await?;
        Ok(GraphDeleteResult { id: p.id, deleted })
    }
}
