//! Runs in the background (session.spawn, session.send): a row in `runs` while it runs, its
//! outcome when it ends, and `session.completed` pushed to the client that started it.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde_json::json;

use crate::api::error::GatewayError;
use crate::api::generated::types::SubagentRunStatus;
use crate::api::CallContext;
use crate::runtime::agents::Agent;
use crate::runtime::agents::Agents;
use crate::runtime::control::Control;
use crate::runtime::sessions::SessionIdent;
use crate::runtime::turn::{TurnOutcome, TurnRequest, Turns};
use crate::store::runs::RunRow;
use crate::store::Store;

/// A run to start.
pub struct RunSpec {
    pub agent: Arc<Agent>,
    pub session: SessionIdent,
    pub task: String,
    /// Who starts the run: it owns the run (its client id), and the turn gets its scopes
    /// (narrowed to `scopes`) and tenant.
    pub caller: CallContext,
    /// The scopes the run's tools may require (at most the caller's).
    pub scopes: crate::api::scopes::Scopes,
    pub parent_run_id: Option<String>,
    pub max_steps: Option<u32>,
    pub model: Option<String>,
    pub only_tools: Option<BTreeSet<String>>,
    /// Ends the turn (finish reason error) when it runs longer.
    pub timeout: Option<std::time::Duration>,
    /// Stored with the run (see `RunRow::delivery`).
    pub delivery: Option<String>,
}

impl RunSpec {
    /// A run of `agent` on `session` for `caller` with every option at its default: the
    /// caller's scopes, no parent, the agent's own steps, model and tools, no timeout.
    pub fn new(
        agent: Arc<Agent>,
        session: SessionIdent,
        task: String,
        caller: &CallContext,
    ) -> Self {
        Self {
            agent,
            session,
            task,
            caller: caller.clone(),
            scopes: caller.scopes,
            parent_run_id: None,
            max_steps: None,
            model: None,
            only_tools: None,
            timeout: None,
            delivery: None,
        }
    }
}

/// A started run: its row as inserted, and the task finishing it.
pub struct Started {
    pub row: RunRow,
    pub done: tokio::task::JoinHandle<(RunRow, Option<TurnOutcome>)>,
}

/// Background runs: their rows, admission, and the turn each one runs.
pub struct Runs {
    store: Store,
    /// A resumed run's agent is looked up again (`queue.rs`).
    pub(super) agents: Arc<Agents>,
    /// Admission, and the push to the client that started a run.
    control: Arc<Control>,
    turns: Arc<Turns>,
}

impl Runs {
    pub fn new(
        store: Store,
        agents: Arc<Agents>,
        control: Arc<Control>,
        turns: Arc<Turns>,
    ) -> Self {
        Self {
            store,
            agents,
            control,
            turns,
        }
    }

    /// The store the runs are recorded in.
    pub(super) fn store(&self) -> &Store {
        &self.store
    }

    /// Records the run as running and starts it on its own task (it keeps running when the
    /// caller stops waiting).
    pub async fn start_run(self: &Arc<Self>, spec: RunSpec) -> Result<Started, GatewayError> {
        let permit = self.control.admission.admit(Some(&spec.caller.client_id))?;
        if spec.agent.suspended {
            return Err(GatewayError::Conflict(format!(
                "Agent {} is suspended; agents.resume lets it run again",
                spec.agent.id
            )));
        }
        let run_id = format!("run_{}", uuid::Uuid::new_v4().simple());
        let row = RunRow {
            run_id: run_id.clone(),
            root_run_id: spec.parent_run_id.clone().unwrap_or_else(|| run_id.clone()),
            parent_run_id: spec.parent_run_id.clone(),
            agent_id: spec.agent.id.clone(),
            session_key: spec.session.key.clone(),
            task: spec.task.clone(),
            status: SubagentRunStatus::Running.as_str().to_owned(),
            depth: i64::from(spec.parent_run_id.is_some()),
            client_id: spec.caller.client_id.clone(),
            started_at: crate::clock::now_ms(),
            delivery: spec.delivery.clone(),
            ..RunRow::default()
        };
        self.store.run_insert(&row).await?;
        Ok(self.spawn_run(row, spec, permit))
    }

    /// Starts a run whose row was written as queued (a webhook run, acknowledged before it
    /// got a slot): it becomes running, or failed when its agent cannot run now.
    pub async fn start_queued_run(
        self: &Arc<Self>,
        mut row: RunRow,
        spec: RunSpec,
    ) -> Result<Started, GatewayError> {
        // A run that cannot start now (suspended agent, over `gateway.limits`) fails with the
        // reason on its row: it was acknowledged, so it never just disappears.
        let refused = if spec.agent.suspended {
            Err(GatewayError::Conflict(format!(
                "Agent {} is suspended; agents.resume lets it run again",
                spec.agent.id
            )))
        } else {
            self.control.admission.admit(Some(&spec.caller.client_id))
        };
        let permit = match refused {
            Ok(permit) => permit,
            Err(e) => {
                row.status = SubagentRunStatus::Failed.as_str().to_owned();
                row.completed_at = Some(crate::clock::now_ms());
                row.error = Some(e.to_string());
                self.store.run_finish(&row).await?;
                return Err(e);
            }
        };
        row.started_at = crate::clock::now_ms();
        row.status = SubagentRunStatus::Running.as_str().to_owned();
        self.store
            .run_mark_running(&row.run_id, row.started_at)
            .await?;
        Ok(self.spawn_run(row, spec, permit))
    }

    /// Runs `spec`'s turn on its own task (holding its admission `permit` until it ends) and
    /// records its end in `row`.
    fn spawn_run(
        self: &Arc<Self>,
        row: RunRow,
        spec: RunSpec,
        permit: crate::runtime::admission::Permit,
    ) -> Started {
        let runs = self.clone();
        let mut finished = row.clone();
        #[allow(
            clippy::disallowed_methods,
            reason = "a background run ends with its turn (cancelled on timeout or session.stop); its row records the outcome"
        )]
        let done = tokio::spawn(async move {
            let cancel = tokio_util::sync::CancellationToken::new();
            let _timer = spec.timeout.map(|t| {
                let cancel = cancel.clone();
                tokio_util::task::AbortOnDropHandle::new(tokio::spawn(async move {
                    tokio::time::sleep(t).await;
                    cancel.cancel();
                }))
            });
            let outcome = runs
                .turns
                .run_turn(TurnRequest {
                    session: Some(spec.session.clone()),
                    max_steps: spec.max_steps,
                    model: spec.model,
                    only_tools: spec.only_tools,
                    cancel,
                    scopes: spec.scopes,
                    admitted: Some(permit),
                    ..TurnRequest::new(spec.agent, spec.task, &spec.caller)
                })
                .await;
            finished.completed_at = Some(crate::clock::now_ms());
            let result = match &outcome {
                Ok(o) => {
                    finished.status = SubagentRunStatus::Completed.as_str().to_owned();
                    finished.response = Some(o.response.clone());
                    finished.input_tokens = Some(o.input_tokens as i64);
                    finished.output_tokens = Some(o.output_tokens as i64);
                    finished.cost_usd = Some(o.cost_usd);
                    finished.finish_reason = Some(o.finish.as_str().to_owned());
                    json!(o.result())
                }
                Err(e) => {
                    finished.status = SubagentRunStatus::Failed.as_str().to_owned();
                    let msg = match e {
                        GatewayError::Internal(_) => "internal error".to_owned(),
                        other => other.to_string(),
                    };
                    finished.error = Some(msg.clone());
                    json!({"error": msg})
                }
            };
            if let Err(e) = runs.store.run_finish(&finished).await {
                tracing::error!(run = %finished.run_id, error = %e, "run outcome not recorded");
            }
            runs.control.push_client(
                &finished.client_id,
                "session.completed",
                json!({
                    "sessionKey": finished.session_key,
                    "runId": finished.run_id,
                    "status": finished.status,
                    "result": result,
                }),
            );
            (finished, outcome.ok())
        });
        Started { row, done }
    }
}
