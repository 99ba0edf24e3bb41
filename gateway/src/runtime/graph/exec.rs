//! The executor of one graph run: starts ready nodes in execution order within the run's
//! concurrency, decides each node once its inputs are final (run, or skip), applies the
//! failure policy, the timeouts, the retries and the budget, and keeps the run's record.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::task::JoinSet;

use super::definition::{Def, Work};
use super::expr::Scope;
use super::{template, Artifact, Execution, Graphs, MAX_NODE_OUTPUT};
use crate::api::generated::types::{GraphNodeKind, GraphOnFailure};
use crate::api::CallContext;
use crate::runtime::runs::RunSpec;
use crate::runtime::sessions::{CallerKey, SessionIdent};

/// How often the executor checks the budget, stores progress and (on a shared database)
/// looks for a cancel request another node stored.
const TICK: Duration = Duration::from_millis(250);
/// The error of an agent node whose run was killed from outside (`run.kill`,
/// `subagent.kill`).
const NODE_RUN_KILLED: &str = "its run was killed";
/// The wait before retry n is n times this.
const RETRY_BACKOFF: Duration = Duration::from_millis(250);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Pending,
    Running,
    Completed,
    Failed,
    /// Not run: `failure` when because of a failed dependency.
    Skipped {
        failure: bool,
    },
    Cancelled,
}

impl Status {
    fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Running => "running",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Skipped { .. } => "skipped",
            Self::Cancelled => "cancelled",
        }
    }
}

/// How the whole run ended early.
struct Stopped {
    status: &'static str,
    error: String,
}

/// What an agent or tool node's task answers.
struct Done {
    output: String,
    artifacts: Vec<Artifact>,
}

/// One run's moving state.
struct Run<'a> {
    graphs: &'a Arc<Graphs>,
    ex: &'a Arc<Execution>,
    def: &'a Def,
    caller: CallContext,
    vars: Arc<HashMap<String, String>>,
    status: Vec<Status>,
    outputs: Vec<Option<Arc<str>>>,
    /// Per edge: followed (Some(true)), not followed (Some(false)), undecided (None).
    followed: Vec<Option<bool>>,
    /// Per node: inputs not yet final.
    waiting: Vec<usize>,
    /// Position of each node in the execution order.
    position: Vec<usize>,
    ready: BinaryHeap<Reverse<usize>>,
    tasks: JoinSet<(usize, Result<Done, String>)>,
    failed_any: bool,
    dirty: bool,
}

/// Runs `ex` to its end and stores its final state.
pub(super) async fn drive(
    graphs: &Arc<Graphs>,
    ex: &Arc<Execution>,
    caller: CallContext,
    variables: BTreeMap<String, String>,
) {
    let def = ex.def.clone();
    let n = def.nodes.len();
    let mut position = vec![0; n];
    for (pos, &i) in def.order.iter().enumerate() {
        position[i] = pos;
    }
    let mut run = Run {
        graphs,
        ex,
        def: &def,
        caller,
        vars: Arc::new(variables.into_iter().collect()),
        status: vec![Status::Pending; n],
        outputs: vec![None; n],
        followed: vec![None; def.edges.len()],
        waiting: def.incoming.iter().map(Vec::len).collect(),
        position,
        ready: BinaryHeap::new(),
        tasks: JoinSet::new(),
        failed_any: false,
        dirty: false,
    };
    for i in 0..n {
        if def.incoming[i].is_empty() {
            run.ready.push(Reverse(run.position[i]));
        }
    }
    let stopped = run.run_loop().await;
    run.finish(stopped).await;
}

impl Run<'_> {
    async fn run_loop(&mut self) -> Option<Stopped> {
        let deadline = tokio::time::Instant::now() + self.def.run_timeout;
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let shared = self.graphs.store.is_shared();
        let mut ticks = 0u64;
        loop {
            if let Some(stop) = self.start_ready() {
                return Some(stop);
            }
            if self.tasks.is_empty() && self.ready.is_empty() {
                return None;
            }
            tokio::select! {
                biased;
                () = self.ex.cancel.cancelled() => {
                    return Some(Stopped { status: "cancelled", error: "cancelled".to_owned() });
                }
                () = self.ex.root.kill.cancelled() => {
                    return Some(Stopped { status: "cancelled", error: "its run tree was killed".to_owned() });
                }
                () = tokio::time::sleep_until(deadline) => {
                    return Some(Stopped {
                        status: "failed",
                        error: format!("timed out after {} ms", self.def.run_timeout.as_millis()),
                    });
                }
                _ = tick.tick() => {
                    ticks += 1;
                    if let Some(stop) = self.over_budget() {
                        return Some(stop);
                    }
                    if self.dirty {
                        self.dirty = false;
                        self.store_progress().await;
                    }
                    if shared && ticks.is_multiple_of(2)
                        && self.graphs.store.graph_run_cancel_requested(&self.ex.root.run_id).await.unwrap_or(false)
                    {
                        return Some(Stopped { status: "cancelled", error: "cancelled".to_owned() });
                    }
                }
                Some(joined) = self.tasks.join_next() => {
                    let Ok((i, result)) = joined else { continue };
                    // A node run killed from outside: the whole tree's kill (run.kill on
                    // another node stored a cancel request first) cancels the graph; a kill
                    // of the node's run alone (subagent.kill) fails the node.
                    if shared
                        && result.as_ref().err().is_some_and(|e| e == NODE_RUN_KILLED)
                        && self.graphs.store.graph_run_cancel_requested(&self.ex.root.run_id).await.unwrap_or(false)
                    {
                        return Some(Stopped { status: "cancelled", error: "its run tree was killed".to_owned() });
                    }
                    if let Some(stop) = self.finish_node(i, result) {
                        return Some(stop);
                    }
                    if let Some(stop) = self.over_budget() {
                        return Some(stop);
                    }
                }
            }
        }
    }

    /// Starts ready nodes while the concurrency allows: agent and tool nodes as tasks, the
    /// others at once.
    fn start_ready(&mut self) -> Option<Stopped> {
        while self.tasks.len() < self.def.max_concurrency {
            let Some(Reverse(pos)) = self.ready.pop() else {
                break;
            };
            let i = self.def.order[pos];
            self.set_status(i, Status::Running, None, 1);
            let node = &self.def.nodes[i];
            match &node.work {
                Work::Agent { .. } | Work::Tool { .. } => self.spawn_task(i),
                Work::Transform { template } => {
                    let out = template::render(template, |n| self.output_of(n), |v| self.var(v));
                    if let Some(stop) = self.finish_node(
                        i,
                        Ok(Done {
                            output: out,
                            artifacts: Vec::new(),
                        }),
                    ) {
                        return Some(stop);
                    }
                }
                Work::Merge => {
                    let parts: Vec<&str> = self.def.incoming[i]
                        .iter()
                        .filter(|&&e| self.followed[e] == Some(true))
                        .filter_map(|&e| self.outputs[self.def.edges[e].from].as_deref())
                        .collect();
                    let out = parts.join("\n\n");
                    if let Some(stop) = self.finish_node(
                        i,
                        Ok(Done {
                            output: out,
                            artifacts: Vec::new(),
                        }),
                    ) {
                        return Some(stop);
                    }
                }
                Work::Condition { expression } => {
                    let input = self.def.incoming[i]
                        .iter()
                        .filter(|&&e| self.followed[e] == Some(true))
                        .find_map(|&e| self.outputs[self.def.edges[e].from].clone());
                    let outputs = self.completed_outputs();
                    let result = expression
                        .holds(&Scope {
                            output: input.as_deref().unwrap_or(""),
                            outputs: &outputs,
                            vars: &self.vars,
                        })
                        .map(|b| Done {
                            output: b.to_string(),
                            artifacts: Vec::new(),
                        });
                    if let Some(stop) = self.finish_node(i, result) {
                        return Some(stop);
                    }
                }
            }
        }
        None
    }

    fn output_of(&self, node: &str) -> Option<&str> {
        let i = self.def.nodes.iter().position(|n| n.id == node)?;
        self.outputs[i].as_deref()
    }

    fn var(&self, name: &str) -> Option<&str> {
        self.vars.get(name).map(String::as_str)
    }

    fn completed_outputs(&self) -> HashMap<String, String> {
        self.def
            .nodes
            .iter()
            .zip(&self.outputs)
            .filter_map(|(n, o)| Some((n.id.clone(), o.as_deref()?.to_owned())))
            .collect()
    }

    /// Starts an agent or tool node's attempts on a task of the run.
    fn spawn_task(&mut self, i: usize) {
        let node = &self.def.nodes[i];
        let out = |n: &str| self.output_of(n);
        let var = |v: &str| self.var(v);
        let job = match &node.work {
            Work::Agent { agent_id, prompt } => Job::Agent {
                agent_id: agent_id.clone(),
                prompt: template::render(prompt, out, var),
            },
            Work::Tool { tool, args } => Job::Tool {
                tool: tool.clone(),
                args: template::render_json(args, &out, &var),
            },
            _ => return,
        };
        let ctx = TaskCtx {
            graphs: self.graphs.clone(),
            ex: self.ex.clone(),
            caller: self.caller.clone(),
            node: i,
            node_id: node.id.clone(),
            retries: self.def.max_retries,
            timeout: self.def.node_timeout,
        };
        self.tasks
            .spawn(async move { (i, ctx.attempts(job).await) });
    }

    /// Records a node's end, decides what follows from it, and applies the failure policy.
    fn finish_node(&mut self, i: usize, result: Result<Done, String>) -> Option<Stopped> {
        let node = &self.def.nodes[i];
        let result = result.and_then(|done| {
            // The node's edges are decided by its output: a condition that does not yield a
            // bool fails the node.
            let mut decided = Vec::with_capacity(self.def.outgoing[i].len());
            let outputs = if self.def.outgoing[i]
                .iter()
                .any(|&e| self.def.edges[e].condition.is_some())
            {
                let mut o = self.completed_outputs();
                o.insert(node.id.clone(), done.output.clone());
                Some(o)
            } else {
                None
            };
            let empty = HashMap::new();
            let outputs = outputs.as_ref().unwrap_or(&empty);
            for &e in &self.def.outgoing[i] {
                let followed = match (&self.def.edges[e].condition, node.kind) {
                    (Some(c), _) => c.holds(&Scope {
                        output: &done.output,
                        outputs,
                        vars: &self.vars,
                    })?,
                    (None, GraphNodeKind::Condition) => done.output == "true",
                    (None, _) => true,
                };
                decided.push((e, followed));
            }
            Ok((done, decided))
        });
        match result {
            Ok((done, decided)) => {
                let mut output = done.output;
                if output.len() > MAX_NODE_OUTPUT {
                    let mut cut = MAX_NODE_OUTPUT;
                    while !output.is_char_boundary(cut) {
                        cut -= 1;
                    }
                    output.truncate(cut);
                    output.push_str("\n[truncated]");
                }
                self.outputs[i] = Some(Arc::from(output.as_str()));
                {
                    let mut nodes = self.ex.nodes.lock().unwrap_or_else(|p| p.into_inner());
                    nodes[i].output = Some(output);
                    nodes[i].artifacts = done.artifacts;
                }
                self.set_status(i, Status::Completed, None, 0);
                for (e, followed) in decided {
                    self.followed[e] = Some(followed);
                }
                self.release(i);
                None
            }
            Err(why) => {
                self.failed_any = true;
                self.set_status(i, Status::Failed, Some(why.clone()), 0);
                for &e in &self.def.outgoing[i] {
                    self.followed[e] = Some(false);
                }
                if self.def.on_failure == GraphOnFailure::Stop {
                    return Some(Stopped {
                        status: "failed",
                        error: format!("node {} failed: {why}", node.id),
                    });
                }
                self.release(i);
                None
            }
        }
    }

    /// Counts `i` final for the targets of its edges and decides those whose inputs are all
    /// final: skipped (a failed dependency, or no followed edge) or ready. Skips cascade.
    fn release(&mut self, i: usize) {
        let mut finals = vec![i];
        while let Some(f) = finals.pop() {
            for &e in &self.def.outgoing[f] {
                let t = self.def.edges[e].to;
                self.waiting[t] -= 1;
                if self.waiting[t] > 0 {
                    continue;
                }
                let inputs = &self.def.incoming[t];
                let failure = inputs.iter().any(|&e| {
                    matches!(
                        self.status[self.def.edges[e].from],
                        Status::Failed | Status::Skipped { failure: true }
                    )
                });
                let any_followed = inputs.iter().any(|&e| self.followed[e] == Some(true));
                if failure || !any_followed {
                    let why = if failure {
                        "a node it depends on failed"
                    } else {
                        "none of its incoming edges was followed"
                    };
                    self.set_status(t, Status::Skipped { failure }, Some(why.to_owned()), 0);
                    for &out in &self.def.outgoing[t] {
                        self.followed[out] = Some(false);
                    }
                    finals.push(t);
                } else {
                    self.ready.push(Reverse(self.position[t]));
                }
            }
        }
    }

    /// Sets a node's status (and its times), publishing `graph:node_updated`. `attempt` is
    /// the attempt a `running` status starts (0: not an attempt).
    fn set_status(&mut self, i: usize, status: Status, error: Option<String>, attempt: u32) {
        self.status[i] = status;
        self.dirty = true;
        mark(self.graphs, self.ex, i, status.as_str(), error, attempt);
    }

    /// A budget cap the run's tree reached.
    fn over_budget(&self) -> Option<Stopped> {
        let budget = self.def.budget.as_ref()?;
        let (tokens, usd) = self.ex.root.budget.spent();
        let tokens_out = budget
            .max_tokens
            .is_some_and(|m| tokens >= u64::try_from(m).unwrap_or(0));
        let usd_out = budget.max_cost_usd.is_some_and(|m| usd >= m);
        (tokens_out || usd_out).then(|| Stopped {
            status: "failed",
            error: format!("budget reached: {tokens} tokens, {usd:.4} USD spent"),
        })
    }

    async fn store_progress(&self) {
        let row = self.ex.stored_row();
        if let Err(e) = self.graphs.store.graph_run_update(&row).await {
            tracing::warn!(run = %row.run_id, error = %e, "graph run progress not stored");
        }
    }

    /// Ends the run: stops what still runs, cancels what never started, stores the final
    /// state and publishes `graph:completed`.
    async fn finish(mut self, stopped: Option<Stopped>) {
        if stopped.is_some() {
            // Agent nodes' runs are killed with the tree below the root; tool calls are
            // dropped with their tasks.
            let tree = self.graphs.runs.tree();
            let below: Vec<_> = tree
                .subtree(&self.ex.root.run_id)
                .into_iter()
                .filter(|r| r.run_id != self.ex.root.run_id)
                .collect();
            tree.kill(&below);
            self.tasks.abort_all();
            while self.tasks.join_next().await.is_some() {}
            crate::runtime::tree::ended(&below, crate::runtime::runs::KILL_WAIT).await;
            for i in 0..self.status.len() {
                if matches!(self.status[i], Status::Pending | Status::Running) {
                    self.set_status(i, Status::Cancelled, None, 0);
                }
            }
        }
        let (status, error) = match stopped {
            Some(s) => (s.status, Some(s.error)),
            None if self.failed_any => ("failed", Some(first_failure(&self))),
            None => ("completed", None),
        };
        let now = crate::clock::now_ms();
        {
            let mut row = self.ex.row.lock().unwrap_or_else(|p| p.into_inner());
            row.status = status.to_owned();
            row.error = error.clone();
            row.completed_at = Some(now);
        }
        // The counters come with the snapshot, from the nodes.
        let row = self.ex.stored_row();
        if let Err(e) = self.graphs.store.graph_run_update(&row).await {
            tracing::error!(run = %row.run_id, error = %e, "graph run outcome not stored");
        }
        // Retention: the owner's newest `graphs.keepRunsPerOwner` ended runs stay.
        let keep = i64::from(self.graphs.config().keep_runs_per_owner);
        if let Err(e) = self.graphs.store.graph_runs_trim(&row.owner, keep).await {
            tracing::warn!(owner = %row.owner, error = %e, "old graph runs not trimmed");
        }
        self.graphs.runs.tree().finish(&self.ex.root, None);
        self.graphs.control.events.publish_owned(
            Some(Arc::from(row.owner.as_str())),
            "graph:completed",
            super::without_nulls(json!({
                "runId": row.run_id,
                "status": status,
                "error": error,
                "completedNodes": row.completed_nodes,
                "failedNodes": row.failed_nodes,
                "durationMs": row.started_at.map(|s| (now - s).max(0)),
            })),
        );
    }
}

/// The error of the first node that failed, in execution order.
fn first_failure(run: &Run<'_>) -> String {
    let nodes = run.ex.nodes.lock().unwrap_or_else(|p| p.into_inner());
    run.def
        .order
        .iter()
        .find(|&&i| run.status[i] == Status::Failed)
        .map_or_else(
            || "a node failed".to_owned(),
            |&i| {
                format!(
                    "node {} failed: {}",
                    nodes[i].node_id,
                    nodes[i].error.as_deref().unwrap_or("failed")
                )
            },
        )
}

/// Updates node `i`'s live state and publishes `graph:node_updated`.
fn mark(
    graphs: &Graphs,
    ex: &Execution,
    i: usize,
    status: &str,
    error: Option<String>,
    attempt: u32,
) {
    let now = crate::clock::now_ms();
    let (node_id, kind, attempts) = {
        let mut nodes = ex.nodes.lock().unwrap_or_else(|p| p.into_inner());
        let node = &mut nodes[i];
        node.status = status.to_owned();
        if status == "running" {
            node.started_at.get_or_insert(now);
            node.attempts = attempt.max(node.attempts);
            node.error = None;
        } else {
            node.completed_at = Some(now);
            node.error = error.clone();
        }
        (node.node_id.clone(), node.kind.clone(), node.attempts)
    };
    graphs.control.events.publish_owned(
        Some(Arc::from(ex.root.client_id.as_str())),
        "graph:node_updated",
        super::without_nulls(json!({
            "runId": ex.root.run_id,
            "nodeId": node_id,
            "type": kind,
            "status": status,
            "attempt": attempts,
            "error": error,
        })),
    );
}

/// What an agent or tool node does, rendered.
enum Job {
    Agent {
        agent_id: String,
        prompt: String,
    },
    Tool {
        tool: String,
        args: serde_json::Value,
    },
}

/// What a node's task needs.
struct TaskCtx {
    graphs: Arc<Graphs>,
    ex: Arc<Execution>,
    caller: CallContext,
    node: usize,
    node_id: String,
    retries: u32,
    timeout: Duration,
}

impl TaskCtx {
    /// The node's attempts: the first, then up to `retries` more after a failure.
    async fn attempts(self, job: Job) -> Result<Done, String> {
        let mut attempt = 1;
        loop {
            if attempt > 1 {
                mark(&self.graphs, &self.ex, self.node, "running", None, attempt);
            }
            let result = match &job {
                Job::Agent { agent_id, prompt } => self.agent(agent_id, prompt, attempt).await,
                Job::Tool { tool, args } => self.tool(tool, args).await,
            };
            match result {
                Ok(done) => return Ok(done),
                // A killed run is an operator's decision: never retried.
                Err(why) if attempt > self.retries || why == NODE_RUN_KILLED => return Err(why),
                Err(_) => {
                    tokio::time::sleep(RETRY_BACKOFF * attempt).await;
                    attempt += 1;
                }
            }
        }
    }

    /// One agent turn as a run below the graph's root, in a session of its own.
    async fn agent(&self, agent_id: &str, prompt: &str, attempt: u32) -> Result<Done, String> {
        let graphs = &self.graphs;
        let agent = graphs.agents.require(agent_id).map_err(|e| e.to_string())?;
        let user = if attempt == 1 {
            format!("{}.{}", self.ex.root.run_id, self.node_id)
        } else {
            format!("{}.{}.{attempt}", self.ex.root.run_id, self.node_id)
        };
        let key = CallerKey {
            channel: Some("graph"),
            tenant: None,
            user: Some(&user),
        };
        let session = SessionIdent::for_caller(&self.caller, &agent.id, key).map_err(|r| r.why)?;
        let started = graphs
            .runs
            .start_run(RunSpec {
                parent: Some(self.ex.root.clone()),
                timeout: Some(self.timeout),
                ..RunSpec::new(agent, session, prompt.to_owned(), &self.caller)
            })
            .await
            .map_err(|e| e.to_string())?;
        let child = graphs.runs.tree().get(&started.row.run_id);
        let (row, outcome) = started
            .done
            .await
            .map_err(|_| "the node's run ended abnormally".to_owned())?;
        let artifacts = child.map_or_else(Vec::new, |c| {
            c.saved_files()
                .into_iter()
                .map(|f| Artifact {
                    filename: f.file_name,
                    media_id: f.media_id,
                    size_bytes: i64::try_from(f.size).unwrap_or(i64::MAX),
                })
                .collect()
        });
        let ok = row.status == "completed"
            && outcome
                .as_ref()
                .is_some_and(|o| o.finish != crate::api::generated::types::FinishReason::Error);
        if ok {
            Ok(Done {
                output: row.response.unwrap_or_default(),
                artifacts,
            })
        } else if row.status == "timeout" {
            Err(format!("timed out after {} ms", self.timeout.as_millis()))
        } else if row.status == "killed" {
            Err(NODE_RUN_KILLED.to_owned())
        } else {
            Err(row
                .error
                .or(row.response.filter(|r| !r.is_empty()))
                .unwrap_or_else(|| format!("the node's run ended {}", row.status)))
        }
    }

    /// One tool call on the root's lease.
    async fn tool(&self, tool: &str, args: &serde_json::Value) -> Result<Done, String> {
        let graphs = &self.graphs;
        let agent_id = self.ex.root.agent_id.as_str();
        let agent = graphs.agents.require(agent_id).map_err(|e| e.to_string())?;
        let label = format!("graph:{}.{}", self.ex.root.run_id, self.node_id);
        let call = graphs.turns.call_tool(crate::runtime::turn::ToolCallOf {
            agent: &agent,
            caller: &self.caller,
            run: &self.ex.root,
            tool,
            args,
            label: &label,
            cancel: &self.ex.cancel,
        });
        let output = tokio::time::timeout(self.timeout, call)
            .await
            .map_err(|_| format!("timed out after {} ms", self.timeout.as_millis()))??;
        let artifacts = if tool == "save_file" {
            saved_file(&output, args).into_iter().collect()
        } else {
            Vec::new()
        };
        Ok(Done { output, artifacts })
    }
}

/// The file a `save_file` call saved, from its result.
fn saved_file(output: &str, args: &serde_json::Value) -> Option<Artifact> {
    let v: serde_json::Value = serde_json::from_str(output).ok()?;
    Some(Artifact {
        filename: args["fileName"].as_str()?.to_owned(),
        media_id: v["id"].as_str()?.to_owned(),
        size_bytes: v["size"].as_i64()?,
    })
}
