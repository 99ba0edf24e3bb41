//! Runs in the background (session.spawn, session.send): a row in `runs` while it runs, its
//! outcome when it ends, and `session.completed` pushed to the client that started it.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde_json::json;

use crate::api::error::GatewayError;
use crate::api::generated::types::SubagentRunStatus;
use crate::api::CallContext;
use crate::config::autonomy::AutonomyConfig;
use crate::runtime::agents::Agent;
use crate::runtime::agents::Agents;
use crate::runtime::control::Control;
use crate::runtime::profiles::Profiles;
use crate::runtime::sessions::SessionIdent;
use crate::runtime::tree::{LiveRun, Placement, Stop};
use crate::runtime::turn::{TurnOutcome, TurnRequest, Turns};
use crate::store::runs::{RunRow, StopScope};
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
    /// The run whose turn spawned this one (a sub-agent); None starts a tree.
    pub parent: Option<Arc<LiveRun>>,
    /// A spawn (`session.spawn`, the `spawn_agent` tool): refused while spawning is paused
    /// and, under a parent, past `autonomy.subagents`.
    pub spawned: bool,
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
            parent: None,
            spawned: false,
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

/// Background runs: their rows, admission, their place in the run tree, and the turn each
/// one runs.
pub struct Runs {
    store: Store,
    /// A resumed run's agent is looked up again (`queue.rs`).
    pub(super) agents: Arc<Agents>,
    /// Admission, the run registry, and the push to the client that started a run.
    control: Arc<Control>,
    turns: Arc<Turns>,
    /// Sub-agent limits and the denial breaker (`autonomy`).
    autonomy: AutonomyConfig,
    /// `autonomy.profiles`, compiled.
    profiles: Profiles,
}

/// How a run ended, from its turn's outcome and what stopped it.
fn final_status(
    live: &LiveRun,
    outcome: Option<&Result<TurnOutcome, GatewayError>>,
    timed_out: bool,
) -> SubagentRunStatus {
    match (live.stopped(), outcome) {
        (Some(Stop::Killed), _) | (None, None) => SubagentRunStatus::Killed,
        (Some(Stop::Revoked), _) => SubagentRunStatus::Revoked,
        (Some(Stop::DenialBreaker), _) => SubagentRunStatus::Completed,
        (None, Some(Ok(_))) if timed_out => SubagentRunStatus::Timeout,
        (None, Some(Ok(_))) => SubagentRunStatus::Completed,
        (None, Some(Err(_))) => SubagentRunStatus::Failed,
    }
}

impl Runs {
    pub fn new(
        store: Store,
        agents: Arc<Agents>,
        control: Arc<Control>,
        turns: Arc<Turns>,
        autonomy: AutonomyConfig,
    ) -> Self {
        Self {
            store,
            agents,
            control,
            turns,
            profiles: Profiles::new(&autonomy),
            autonomy,
        }
    }

    /// The store the runs are recorded in.
    pub(super) fn store(&self) -> &Store {
        &self.store
    }

    /// The run registry of this process.
    pub fn tree(&self) -> &crate::runtime::tree::RunTree {
        &self.control.tree
    }

    /// Refuses a spawn while spawning is paused or past `autonomy.subagents`, publishing
    /// `session:sub_agent_spawn_rejected`.
    fn admit_spawn(&self, spec: &RunSpec) -> Result<(), GatewayError> {
        if !spec.spawned {
            return Ok(());
        }
        self.control
            .tree
            .admit(spec.parent.as_deref(), &self.autonomy.subagents)
            .map_err(|refused| {
                self.control.events.publish_owned(
                    Some(Arc::from(spec.caller.client_id.as_str())),
                    "session:sub_agent_spawn_rejected",
                    json!({
                        "agentId": spec.agent.id,
                        "parentRunId": spec.parent.as_ref().map(|p| p.run_id.clone()),
                        "reason": refused.code(),
                    }),
                );
                GatewayError::Conflict(format!("Spawn refused: {refused}"))
            })
    }

    /// Records the run as running and starts it on its own task (it keeps running when the
    /// caller stops waiting). The start itself is finished whole even when the caller goes
    /// away in the middle (a parent killed during its `spawn_agent` call, a client hanging up):
    /// a registered run always gets its task, and its row a final status.
    pub async fn start_run(self: &Arc<Self>, spec: RunSpec) -> Result<Started, GatewayError> {
        let runs = self.clone();
        #[allow(
            clippy::disallowed_methods,
            reason = "the start runs to its end whatever its caller does; it ends with it"
        )]
        let start = tokio::spawn(async move { runs.start_whole(spec).await });
        start
            .await
            .map_err(|e| GatewayError::Internal(format!("the run did not start: {e}")))?
    }

    async fn start_whole(self: &Arc<Self>, spec: RunSpec) -> Result<Started, GatewayError> {
        self.admit_spawn(&spec)?;
        let permit = self.control.admission.admit(Some(&spec.caller.client_id))?;
        if spec.agent.suspended {
            return Err(GatewayError::Conflict(format!(
                "Agent {} is suspended; agents.resume lets it run again",
                spec.agent.id
            )));
        }
        let run_id = format!("run_{}", uuid::Uuid::new_v4().simple());
        let live = self.register(&run_id, &spec);
        let row = RunRow {
            run_id,
            root_run_id: live.root_run_id.clone(),
            parent_run_id: live.parent_run_id.clone(),
            agent_id: spec.agent.id.clone(),
            session_key: spec.session.key.clone(),
            task: spec.task.clone(),
            status: SubagentRunStatus::Running.as_str().to_owned(),
            depth: i64::from(live.depth),
            client_id: spec.caller.client_id.clone(),
            started_at: crate::clock::now_ms(),
            delivery: spec.delivery.clone(),
            ..RunRow::default()
        };
        if let Err(e) = self.store.run_insert(&row).await {
            self.control.tree.finish(&live, None);
            return Err(e);
        }
        if spec.spawned {
            self.control.events.publish_owned(
                Some(Arc::from(row.client_id.as_str())),
                "session:sub_agent_spawned",
                json!({
                    "runId": row.run_id,
                    "rootRunId": row.root_run_id,
                    "parentRunId": row.parent_run_id,
                    "depth": row.depth,
                    "agentId": row.agent_id,
                    "sessionKey": row.session_key,
                }),
            );
        }
        Ok(self.spawn_run(row, spec, permit, live))
    }

    /// Puts a new run in the registry, under its parent when it has one.
    fn register(&self, run_id: &str, spec: &RunSpec) -> Arc<LiveRun> {
        self.control.tree.register(Placement {
            run_id: run_id.to_owned(),
            parent: spec.parent.as_ref(),
            agent_id: &spec.agent.id,
            client_id: &spec.caller.client_id,
            scopes: spec.scopes,
            tools: spec.only_tools.clone(),
            denial_threshold: self.autonomy.denial_breaker.threshold,
            timeout: spec.timeout,
            profile: self.profiles.for_root(&spec.agent.id),
        })
    }

    /// Registers the root of a tree that is not itself an agent's run (a graph run, whose
    /// agent nodes run below it and whose tool nodes use its lease), under `agent_id`'s
    /// profile, for a caller `client_id` holding `scopes`. The caller ends it with
    /// `tree().finish`.
    pub fn register_root(
        &self,
        run_id: &str,
        agent_id: &str,
        client_id: &str,
        scopes: crate::api::scopes::Scopes,
    ) -> Arc<LiveRun> {
        self.control.tree.register(Placement {
            run_id: run_id.to_owned(),
            parent: None,
            agent_id,
            client_id,
            scopes,
            tools: None,
            denial_threshold: self.autonomy.denial_breaker.threshold,
            timeout: None,
            profile: self.profiles.for_root(agent_id),
        })
    }

    /// Starts a run whose row was written as queued (a webhook run, acknowledged before it
    /// got a slot): it becomes running, or failed when its agent cannot run now.
    pub async fn start_queued_run(
        self: &Arc<Self>,
        mut row: RunRow,
        spec: RunSpec,
    ) -> Result<Started, GatewayError> {
        // Taken from the queue first: a run a kill or a revocation ended while it waited is
        // not started (its row keeps that final status).
        row.started_at = crate::clock::now_ms();
        row.status = SubagentRunStatus::Running.as_str().to_owned();
        if !self
            .store
            .run_mark_running(&row.run_id, row.started_at)
            .await?
        {
            return Err(GatewayError::Conflict(format!(
                "Run {} was stopped before it started",
                row.run_id
            )));
        }
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
        let live = self.register(&row.run_id, &spec);
        Ok(self.spawn_run(row, spec, permit, live))
    }

    /// Runs `spec`'s turn on its own task (holding its admission `permit` until it ends) and
    /// records its end in `row`. A kill drops the turn where it is (provider call or tool
    /// included); nothing is recorded for it afterwards.
    fn spawn_run(
        self: &Arc<Self>,
        row: RunRow,
        spec: RunSpec,
        permit: crate::runtime::admission::Permit,
        live: Arc<LiveRun>,
    ) -> Started {
        let runs = self.clone();
        let mut finished = row.clone();
        #[allow(
            clippy::disallowed_methods,
            reason = "a background run ends with its turn (cancelled on timeout, session.stop or a kill); its row records the outcome"
        )]
        let done = tokio::spawn(async move {
            let cancel = tokio_util::sync::CancellationToken::new();
            let timed_out = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let _timer = spec.timeout.map(|t| {
                let (cancel, timed_out) = (cancel.clone(), timed_out.clone());
                tokio_util::task::AbortOnDropHandle::new(tokio::spawn(async move {
                    tokio::time::sleep(t).await;
                    timed_out.store(true, std::sync::atomic::Ordering::Release);
                    cancel.cancel();
                }))
            });
            let turn = runs.turns.run_turn(TurnRequest {
                session: Some(spec.session.clone()),
                max_steps: spec.max_steps,
                model: spec.model,
                only_tools: spec.only_tools,
                cancel,
                scopes: spec.scopes,
                admitted: Some(permit),
                run: Some(live.clone()),
                ..TurnRequest::new(spec.agent, spec.task, &spec.caller)
            });
            let outcome = tokio::select! {
                biased;
                () = live.kill.cancelled() => None,
                o = turn => Some(o),
            };
            let status = final_status(
                &live,
                outcome.as_ref(),
                timed_out.load(std::sync::atomic::Ordering::Acquire),
            );
            finished.completed_at = Some(crate::clock::now_ms());
            finished.status = status.as_str().to_owned();
            let result = match &outcome {
                Some(Ok(o)) => {
                    finished.response = Some(o.response.clone());
                    finished.input_tokens = Some(o.input_tokens as i64);
                    finished.output_tokens = Some(o.output_tokens as i64);
                    finished.cost_usd = Some(o.cost_usd);
                    finished.finish_reason = Some(o.finish.as_str().to_owned());
                    if status == SubagentRunStatus::Revoked {
                        finished.error = Some("its lease was revoked".to_owned());
                    } else if live.stopped() == Some(Stop::DenialBreaker) {
                        finished.error = Some("the denial breaker stopped the run tree".to_owned());
                    }
                    json!(o.result())
                }
                Some(Err(e)) => {
                    let msg = match e {
                        GatewayError::Internal(_) => "internal error".to_owned(),
                        other => other.to_string(),
                    };
                    finished.error = Some(msg.clone());
                    json!({"error": msg})
                }
                None => {
                    let msg = match live.stopped() {
                        Some(Stop::DenialBreaker) => "the denial breaker stopped the run tree",
                        _ => "killed",
                    };
                    finished.error = Some(msg.to_owned());
                    json!({"error": msg})
                }
            };
            let stored = match runs.store.run_finish(&finished).await {
                Ok(()) => Some(finished.clone()),
                Err(e) => {
                    tracing::error!(run = %finished.run_id, error = %e, "run outcome not recorded");
                    None
                }
            };
            runs.control.tree.finish(&live, stored);
            if spec.spawned {
                runs.control.events.publish_owned(
                    Some(Arc::from(finished.client_id.as_str())),
                    "session:sub_agent_completed",
                    json!({
                        "runId": finished.run_id,
                        "rootRunId": finished.root_run_id,
                        "status": finished.status,
                        "agentId": finished.agent_id,
                    }),
                );
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
            (finished, outcome.and_then(Result::ok))
        });
        Started { row, done }
    }
}

/// Where a sub-agent spawn comes from: the spawning turn's run (None: the turn is not a run,
/// so the spawn starts a tree), agent, caller and scopes.
pub struct SpawnFrom<'a> {
    pub run: Option<&'a Arc<LiveRun>>,
    pub agent: &'a Arc<Agent>,
    pub caller: &'a crate::api::principal::Principal,
    pub scopes: crate::api::scopes::Scopes,
}

/// One run's answer to a wait.
#[derive(Debug, Clone, PartialEq)]
pub enum Waited {
    /// No such run, or not the caller's.
    Unknown(String),
    /// Still running when the wait ended.
    Running(String),
    /// Ended: its row.
    Ended(Box<RunRow>),
}

impl Waited {
    /// The run's id.
    pub fn run_id(&self) -> &str {
        match self {
            Self::Unknown(id) | Self::Running(id) => id,
            Self::Ended(row) => &row.run_id,
        }
    }

    /// The wait status (`subagent.wait`): completed, denied_unknown, timeout or cancelled
    /// (killed or revoked).
    pub fn status(&self) -> &'static str {
        match self {
            Self::Unknown(_) => "denied_unknown",
            Self::Running(_) => "timeout",
            Self::Ended(row) if matches!(row.status.as_str(), "killed" | "revoked") => "cancelled",
            Self::Ended(_) => "completed",
        }
    }

    /// As the `wait_agents` tool answers it.
    pub fn to_json(&self) -> serde_json::Value {
        let mut v = json!({"runId": self.run_id(), "status": self.status()});
        if let Self::Ended(row) = self {
            v["completion"] = json!({
                "status": row.status,
                "response": row.response,
                "finishReason": row.finish_reason,
                "error": row.error,
                "costUsd": row.cost_usd,
            });
        }
        v
    }
}

/// How often a wait looks at the store for runs another node runs.
const WAIT_POLL: std::time::Duration = std::time::Duration::from_millis(250);

impl Runs {
    /// The live children of a run (a `wait_agents` call without ids waits for them).
    pub fn live_children(&self, run_id: &str) -> Vec<String> {
        self.control
            .tree
            .all()
            .into_iter()
            .filter(|r| r.parent_run_id.as_deref() == Some(run_id))
            .map(|r| r.run_id.clone())
            .collect()
    }

    /// Spawns a sub-agent run of `agent_id` (the spawning agent when None) on `task`, in a new
    /// child session, below `from.run`; answers its row at once (the run goes on).
    pub async fn spawn_child(
        self: &Arc<Self>,
        from: SpawnFrom<'_>,
        agent_id: Option<&str>,
        task: String,
    ) -> Result<RunRow, GatewayError> {
        let agent = match agent_id {
            Some(id) => self.agents.require(id)?,
            None => from.agent.clone(),
        };
        let caller = from.caller.context(None);
        let child = format!("spawn-{}", uuid::Uuid::new_v4().simple());
        let key = crate::runtime::sessions::CallerKey {
            channel: Some("subagent"),
            tenant: None,
            user: Some(&child),
        };
        let session = SessionIdent::for_caller(&caller, &agent.id, key)
            .map_err(|r| GatewayError::InvalidParams(r.why))?;
        let only_tools = from.run.and_then(|r| r.lease.tools.clone());
        let started = self
            .start_run(RunSpec {
                parent: from.run.cloned(),
                spawned: true,
                scopes: from.scopes,
                only_tools,
                ..RunSpec::new(agent, session, task, &caller)
            })
            .await?;
        Ok(started.row)
    }

    /// Waits until every run of `run_ids` has ended or `timeout` passed; one answer per id, in
    /// order. Runs `tenant` does not reach answer [`Waited::Unknown`], like runs that do not
    /// exist. A run live on this node wakes its waiters with its final row (no trip to the
    /// store); runs other nodes hold are read again every [`WAIT_POLL`].
    pub async fn wait(
        &self,
        tenant: &crate::api::tenancy::Tenant,
        run_ids: &[String],
        timeout: std::time::Duration,
    ) -> Result<Vec<Waited>, GatewayError> {
        let deadline = tokio::time::Instant::now() + timeout;
        // (answer so far, the live run when this node runs it)
        let mut slots: Vec<(Waited, Option<Arc<LiveRun>>)> = Vec::with_capacity(run_ids.len());
        for id in run_ids {
            let live = self.control.tree.get(id);
            let answer = match self.store.run_get(tenant, id).await? {
                None => Waited::Unknown(id.clone()),
                Some(row) if row.completed_at.is_some() => Waited::Ended(Box::new(row)),
                Some(_) => Waited::Running(id.clone()),
            };
            slots.push((answer, live));
        }
        loop {
            let mut remote = false;
            for (answer, live) in &mut slots {
                let Waited::Running(id) = answer else {
                    continue;
                };
                match live.as_ref().map(|l| (l.final_row(), l.has_ended())) {
                    Some((Some(row), _)) => *answer = Waited::Ended(Box::new((*row).clone())),
                    Some((None, false)) => {}
                    // Ended without a stored row, or held by another node: ask the store.
                    _ => {
                        let id = id.clone();
                        match self.store.run_get(tenant, &id).await? {
                            Some(row) if row.completed_at.is_some() => {
                                *answer = Waited::Ended(Box::new(row));
                            }
                            _ => remote = remote || live.is_none(),
                        }
                    }
                }
            }
            let pending: Vec<&Arc<LiveRun>> = slots
                .iter()
                .filter(|(a, _)| matches!(a, Waited::Running(_)))
                .filter_map(|(_, l)| l.as_ref())
                .collect();
            if (pending.is_empty() && !remote) || tokio::time::Instant::now() >= deadline {
                return Ok(slots.into_iter().map(|(a, _)| a).collect());
            }
            type Wake<'w> = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'w>>;
            let mut wakes: Vec<Wake<'_>> = pending
                .iter()
                .map(|r| Box::pin(r.ended()) as Wake<'_>)
                .collect();
            if remote {
                wakes.push(Box::pin(tokio::time::sleep(WAIT_POLL)));
            }
            let any_ended = futures_util::future::select_all(wakes);
            let _ = tokio::time::timeout_at(deadline, any_ended).await;
        }
    }
}

/// What `store.announce` says when a stop or a steering message waits for another node.
pub const ANNOUNCE_RUNS: &str = "runs";
/// What it says when spawning is paused or resumed fleet-wide.
pub const ANNOUNCE_PAUSED: &str = "subagents:paused";
pub const ANNOUNCE_RESUMED: &str = "subagents:resumed";
/// Followed by a root run id: `autonomy.evict` on another node.
pub const ANNOUNCE_EVICT: &str = "autonomy:evict:";
/// How often a node of a shared database looks for stops and steering messages other nodes
/// left for its runs (at once when their notification arrives).
const REMOTE_WATCH: std::time::Duration = std::time::Duration::from_millis(500);
/// How long a kill waits for the killed runs to record their final status.
pub const KILL_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

impl Runs {
    /// The live runs of `scope` on this node.
    fn local(&self, scope: StopScope<'_>) -> Vec<Arc<LiveRun>> {
        let tree = &self.control.tree;
        match scope {
            StopScope::Tree(root) => tree.tree(root),
            StopScope::Subtree(run) => tree.subtree(run),
            StopScope::Run(run) => tree.get(run).into_iter().collect(),
        }
    }

    /// Kills the runs of `scope` wherever they run: here at once, on other nodes through the
    /// store; answers (runs killed, leases revoked) once they have ended (at most
    /// [`KILL_WAIT`]).
    pub async fn kill(&self, scope: StopScope<'_>) -> Result<(usize, usize), GatewayError> {
        let local = self.local(scope);
        let (mut killed, mut revoked) = self.control.tree.kill(&local);
        // Runs still waiting for a slot end here and now (their leases were never used).
        let queued = self
            .store
            .runs_end_queued(scope, SubagentRunStatus::Killed.as_str())
            .await?;
        killed += queued.len();
        revoked += queued.len();
        let remote = self.store.runs_request_stop(scope, "killed").await?;
        if !remote.is_empty() {
            self.store.announce(ANNOUNCE_RUNS).await;
        }
        killed += remote.len();
        revoked += remote.iter().filter(|m| m.before.is_none()).count();
        let deadline = tokio::time::Instant::now() + KILL_WAIT;
        crate::runtime::tree::ended(&local, KILL_WAIT).await;
        let ids: Vec<String> = remote.into_iter().map(|m| m.run_id).collect();
        while !ids.is_empty()
            && tokio::time::Instant::now() < deadline
            && !self.store.runs_ended(&ids).await?
        {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        Ok((killed, revoked))
    }

    /// Revokes the leases of `scope` wherever its runs run; answers how many were revoked.
    pub async fn revoke(&self, scope: StopScope<'_>) -> Result<usize, GatewayError> {
        let local = self
            .local(scope)
            .iter()
            .filter(|r| r.lease.revoke())
            .count();
        let queued = self
            .store
            .runs_end_queued(scope, SubagentRunStatus::Revoked.as_str())
            .await?;
        let remote = self.store.runs_request_stop(scope, "revoked").await?;
        if !remote.is_empty() {
            self.store.announce(ANNOUNCE_RUNS).await;
        }
        Ok(local + queued.len() + remote.len())
    }

    /// Steers a running run wherever it runs; false when no node runs it.
    pub async fn steer(&self, run_id: &str, message: String) -> Result<bool, GatewayError> {
        if let Some(live) = self
            .control
            .tree
            .get(run_id)
            .filter(|r| r.stopped().is_none())
        {
            live.steer(message);
            return Ok(true);
        }
        match self.store.run_holder(run_id).await? {
            Some(node) if node != *self.control.node_id => {
                self.store.run_steer_add(run_id, &message).await?;
                self.store.announce(ANNOUNCE_RUNS).await;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Pauses or resumes spawning on every node; true when this node's state changed.
    pub async fn set_paused(&self, paused: bool) -> bool {
        let changed = self.control.tree.set_paused(paused);
        self.store
            .announce(if paused {
                ANNOUNCE_PAUSED
            } else {
                ANNOUNCE_RESUMED
            })
            .await;
        changed
    }

    /// Marks `root` in the daemon-wide evicted set (`autonomy.evict`) on every node: its tree
    /// works under `default` from its next gate decision. True when this node had it marked.
    pub async fn evict(&self, root: &str) -> bool {
        let already = self.control.tree.evict(root);
        self.store
            .announce(&format!("{ANNOUNCE_EVICT}{root}"))
            .await;
        already
    }

    /// On a shared database: applies the stops and steering messages other nodes leave for
    /// this node's runs, every [`REMOTE_WATCH`] and whenever they announce one. Ends with the
    /// generation (the task holds the service weakly).
    pub fn watch_remote(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        let mut epoch = self.control.runs_epoch.subscribe();
        #[allow(
            clippy::disallowed_methods,
            reason = "the watch ends when its generation's runs service is dropped"
        )]
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = tokio::time::sleep(REMOTE_WATCH) => {}
                    changed = epoch.changed() => if changed.is_err() { break },
                }
                let Some(runs) = weak.upgrade() else { break };
                if let Err(e) = runs.apply_remote().await {
                    tracing::warn!(error = %e, "stops and steering of other nodes not read");
                }
            }
        });
    }

    async fn apply_remote(&self) -> Result<(), GatewayError> {
        let tree = &self.control.tree;
        for (run_id, what) in self.store.runs_stops_for_me().await? {
            let Some(live) = tree.get(&run_id) else {
                continue;
            };
            if what == "killed" {
                tree.kill(&tree.subtree(&run_id));
            } else {
                live.lease.revoke();
            }
        }
        for (run_id, message) in self.store.run_steering_take().await? {
            if let Some(live) = tree.get(&run_id) {
                live.steer(message);
            }
        }
        Ok(())
    }
}
