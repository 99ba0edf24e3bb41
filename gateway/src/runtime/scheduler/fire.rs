//! One fire of a cron job: its wake gate, then a real agent turn in the job's own session
//! (`agent:<agent>:cron:<owner>:<jobId>`), recorded as a background run with usage like any
//! turn; then its outcome in the run log and on the job.

use std::sync::Arc;

use serde_json::json;

use super::Scheduler;
use crate::api::generated::types::FinishReason;
use crate::clock::now_ms;
use crate::config::scheduler::GateSpec;
use crate::runtime::scheduler::gate::{run_gate, Decision, GateEnv};
use crate::runtime::scheduler::{summary_of, Slot};
use crate::runtime::sessions::SessionIdent;
use crate::store::scheduler::{Claimed, FireOutcome, JobRow};
use crate::store::sessions::InternalChannel;

/// The channel of cron sessions: an internal channel (only fires write there), though the
/// session belongs to the job's owner, who reads its turns with session.history.
pub const CRON_CHANNEL: &str = InternalChannel::Cron.label();

/// The session a job's fires run in.
pub fn session_of(job: &JobRow) -> SessionIdent {
    SessionIdent::internal(
        InternalChannel::Cron,
        &job.agent_id,
        &job.owner,
        &job.job_id,
    )
}

/// Runs the claimed fire on its own task, holding `slot` until it is recorded.
pub fn spawn(
    scheduler: Arc<Scheduler>,
    job: JobRow,
    claimed: Claimed,
    trigger: &'static str,
    slot: Slot,
) {
    #[allow(
        clippy::disallowed_methods,
        reason = "a fire ends with its turn and holds its fire slot until then"
    )]
    tokio::spawn(async move {
        let _slot = slot;
        fire(&scheduler, &job, claimed, trigger).await;
    });
}

async fn fire(scheduler: &Arc<Scheduler>, job: &JobRow, claimed: Claimed, trigger: &str) {
    let start = now_ms();
    let owner: Arc<str> = Arc::from(job.owner.as_str());
    let session = session_of(job);
    scheduler.control.events.publish_to(
        &owner,
        "scheduler:job_started",
        json!({"jobId": job.job_id, "jobName": job.name, "agentId": job.agent_id,
               "owner": job.owner, "trigger": trigger, "dueAtMs": claimed.due_at,
               "latenessMs": start - claimed.due_at, "sessionKey": session.key,
               "node": scheduler.store.node()}),
    );
    let mut outcome = run(scheduler, job, &claimed, session).await;
    outcome.duration_ms = (now_ms() - start).max(0);
    let keep = i64::from(scheduler.config.run_retention.per_job);
    if let Err(e) = scheduler
        .store
        .cron_finish(&job.job_id, claimed, &outcome, keep)
        .await
    {
        tracing::error!(job = %job.job_id, error = %e, "cron fire outcome not recorded");
    }
    scheduler.control.events.publish_to(
        &owner,
        "scheduler:job_completed",
        json!({"jobId": job.job_id, "jobName": job.name, "agentId": job.agent_id,
               "owner": job.owner, "trigger": trigger, "status": outcome.status,
               "durationMs": outcome.duration_ms, "dueAtMs": claimed.due_at,
               "rootRunId": outcome.root_run_id, "error": outcome.error,
               "gate": outcome.gate.as_deref().and_then(super::jobs::gate_of)}),
    );
    // Releasing the slot (when the task ends) re-arms this node's timer for the job's next
    // due time; other nodes need not hear of it.
}

/// The gate, then the turn.
async fn run(
    scheduler: &Arc<Scheduler>,
    job: &JobRow,
    claimed: &Claimed,
    session: SessionIdent,
) -> FireOutcome {
    let mut gate_record = None;
    let mut gate_calls = 0u32;
    if let Some(spec) = job
        .wake_gate
        .as_deref()
        .and_then(|g| serde_json::from_str::<GateSpec>(g).ok())
    {
        let workspace = crate::runtime::agents::workspace_dir(&scheduler.data_dir, &job.agent_id);
        // A root run for the gate's duration: its lease is what the gate presents on the
        // capability socket (its agent's tools, the job owner as caller, scope rpc; admin for
        // a file job of an agent the file gives adminTrust).
        let gate_run = scheduler.runs.register_root(
            &format!("gate_{}", uuid::Uuid::new_v4().simple()),
            &job.agent_id,
            &job.owner,
            scheduler.gate_scopes(&job.owner, &job.agent_id),
        );
        let socket = crate::runtime::capability::socket_path(&scheduler.data_dir);
        let env = GateEnv {
            job_id: &job.job_id,
            job_name: &job.name,
            agent_id: &job.agent_id,
            due_at_ms: claimed.due_at,
            capability: Some((&socket, gate_run.lease.token())),
            cancel: Some(&gate_run.kill),
        };
        let home = crate::runtime::scheduler::gate::home_dir(&scheduler.data_dir, &job.agent_id);
        let g = run_gate(&workspace, &home, &spec, &env).await;
        // Read before the end revokes it: a lease revoked while the gate ran is its failure.
        let lease_held = gate_run.lease.valid();
        scheduler.runs.tree().finish(&gate_run, None);
        // What the gate really called through its lease; a self-reported `toolCalls` is not
        // recorded.
        gate_calls = gate_run
            .socket
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .total()
            .try_into()
            .unwrap_or(u32::MAX);
        if g.decision == Decision::FailedOpen {
            tracing::warn!(job = %job.job_id, reason = ?g.reason, "wake gate failed open; the turn runs");
        }
        let record = record_of(&g, &gate_run, lease_held);
        if g.decision == Decision::Skip {
            return FireOutcome {
                status: "skipped",
                summary: Some("wake-gate: skipped".into()),
                tool_calls: Some(i64::from(gate_calls)),
                est_turns_saved: Some(1),
                gate: Some(record),
                ..FireOutcome::default()
            };
        }
        gate_record = Some(record);
    }
    let mut outcome = turn(scheduler, job, session).await;
    outcome.gate = gate_record;
    if gate_calls > 0 {
        outcome.tool_calls = Some(outcome.tool_calls.unwrap_or(0) + i64::from(gate_calls));
    }
    outcome
}

/// What the fire records of its gate: the decision, and the gate's run (`obs.explain`'s
/// `orchestrate` entries). A gate whose run was killed, or whose lease was revoked while it
/// ran, is classed `lease_absent`; the skip code is a decision, not a failure.
fn record_of(
    g: &crate::runtime::scheduler::gate::GateOutcome,
    run: &crate::runtime::tree::LiveRun,
    lease_held: bool,
) -> String {
    use crate::runtime::scheduler::gate::Failure;
    use crate::store::records::{GateCall, GateRecord};
    let failure_class = match (g.failure, lease_held) {
        (Some(Failure::Killed), _) | (_, false) => Some("lease_absent"),
        (Some(Failure::SpawnFail), _) => Some("spawn_fail"),
        (Some(Failure::Timeout), _) => Some("timeout"),
        (Some(Failure::StdoutCap), _) => Some("stdout_cap"),
        (Some(Failure::NonzeroExit), _) => Some("nonzero_exit"),
        (None, true) => None,
    };
    let calls = run.socket.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let record = GateRecord {
        decision: g.decision.as_str().to_owned(),
        duration_ms: i64::try_from(g.duration_ms).unwrap_or(i64::MAX),
        reason: g.reason.clone(),
        run_id: Some(run.run_id.clone()),
        lease_id: Some(run.lease.id.clone()),
        exit_code: g.exit_code,
        failure_class: failure_class.map(str::to_owned),
        tool_calls: calls
            .groups
            .iter()
            .map(|c| GateCall {
                tool: c.tool.clone(),
                capability: c.capability.clone(),
                decision: if c.allowed { "allowed" } else { "denied" }.to_owned(),
                count: i64::try_from(c.count).unwrap_or(i64::MAX),
            })
            .collect(),
        calls_dropped: i64::try_from(calls.dropped).unwrap_or(i64::MAX),
        result_count: i64::try_from(calls.results).unwrap_or(i64::MAX),
        result_bytes: i64::try_from(calls.result_bytes).unwrap_or(i64::MAX),
    };
    serde_json::to_string(&record).unwrap_or_default()
}

fn failed(error: String) -> FireOutcome {
    FireOutcome {
        status: "error",
        error: Some(error),
        ..FireOutcome::default()
    }
}

/// The job's agent turn, as a background run of the job's owner with `rpc` tools only (a
/// scheduled turn never gets admin tools, whoever created the job).
async fn turn(scheduler: &Arc<Scheduler>, job: &JobRow, session: SessionIdent) -> FireOutcome {
    let agent = match scheduler.agents.require(&job.agent_id) {
        Ok(a) => a,
        Err(e) => return failed(e.to_string()),
    };
    let spec = scheduler.scheduled_run(agent, session, job.message.clone(), &job.owner, None);
    let started = match scheduler.runs.start_run(spec).await {
        Ok(s) => s,
        Err(e) => return failed(e.to_string()),
    };
    let root = started.row.root_run_id.clone();
    let (row, turn) = match started.done.await {
        Ok(done) => done,
        Err(e) => {
            return FireOutcome {
                root_run_id: Some(root),
                ..failed(format!("the fire's task ended: {e}"))
            }
        }
    };
    let mut out = FireOutcome {
        root_run_id: Some(row.root_run_id.clone()),
        ..FireOutcome::default()
    };
    match turn {
        Some(t) if t.finish != FinishReason::Error => {
            out.status = "ok";
            out.summary = Some(summary_of(&t.response));
            out.tool_calls = Some(i64::from(t.tool_calls));
        }
        Some(t) => {
            out.status = "error";
            out.tool_calls = Some(i64::from(t.tool_calls));
            out.error = Some(super::failure_text(&t));
        }
        None => {
            out.status = "error";
            out.error = Some(row.error.unwrap_or_else(|| "the turn failed".into()));
        }
    }
    out
}
