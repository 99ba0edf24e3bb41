//! The durable run queue of agent runs started from outside (webhook deliveries): a bounded
//! number of places (running plus waiting), run slots, the queued row written before the
//! delivery is acknowledged, and the resumption of queued runs a previous process
//! acknowledged but did not run.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;

use crate::api::error::GatewayError;
use crate::api::generated::methods::Scope;
use crate::api::generated::types::SubagentRunStatus;
use crate::api::principal::Principal;
use crate::runtime::runs::RunSpec;
use crate::runtime::runs::Runs;
use crate::runtime::sessions::SessionIdent;
use crate::store::runs::{ResumableRun, RunRow};

/// The queue of one server generation.
pub struct RunQueue {
    slots: Arc<Semaphore>,
    queued: Arc<AtomicUsize>,
    /// Runs running plus waiting, at most.
    capacity: usize,
}

impl RunQueue {
    /// `max_concurrent` runs at once (at least one), `max_queued` more waiting.
    pub fn new(max_concurrent: usize, max_queued: usize) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(max_concurrent.max(1))),
            queued: Arc::new(AtomicUsize::new(0)),
            capacity: max_concurrent.max(1) + max_queued,
        }
    }

    /// Takes a place in the run queue even when it is full: for runs acknowledged by a
    /// previous process, which the queue owes already.
    fn reserve_owed(&self) -> QueuePlace {
        self.queued.fetch_add(1, Ordering::SeqCst);
        QueuePlace {
            queued: self.queued.clone(),
            slots: self.slots.clone(),
            waiting: Some(crate::metrics::WebhookQueued::enter()),
        }
    }

    /// Takes a place in the run queue, or None when it is full.
    pub fn reserve(&self) -> Option<QueuePlace> {
        let prev = self.queued.fetch_add(1, Ordering::SeqCst);
        if prev >= self.capacity {
            self.queued.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        Some(QueuePlace {
            queued: self.queued.clone(),
            slots: self.slots.clone(),
            waiting: Some(crate::metrics::WebhookQueued::enter()),
        })
    }
}

/// A queued run's place: holds a count until the run ends.
pub struct QueuePlace {
    queued: Arc<AtomicUsize>,
    slots: Arc<Semaphore>,
    /// Counted in `agentgw_webhook_runs_queued` until the run has its slot (or is dropped).
    waiting: Option<crate::metrics::WebhookQueued>,
}

impl QueuePlace {
    /// Waits for a run slot.
    async fn run_slot(&mut self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        let slot = self.slots.clone().acquire_owned().await.ok();
        self.waiting = None;
        slot
    }
}

impl Drop for QueuePlace {
    fn drop(&mut self) {
        self.queued.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Queues `spec`'s run in `place`: its row is written as queued (so a restart resumes it), then
/// the run waits for a slot in the background. An error leaves nothing queued.
pub async fn enqueue(
    runs: &Arc<Runs>,
    place: QueuePlace,
    spec: RunSpec,
) -> Result<(), GatewayError> {
    let row = queued_row(&spec);
    let resume = serde_json::to_string(&Resume::of(&spec))
        .map_err(|e| GatewayError::Internal(format!("run record not encoded: {e}")))?;
    runs.store().run_insert_queued(&row, &resume).await?;
    #[allow(
        clippy::disallowed_methods,
        reason = "a queued run ends with its turn; its row makes it resumable after a restart"
    )]
    tokio::spawn(run_queued(runs.clone(), place, row, spec));
    Ok(())
}

/// Waits for a run slot, then runs the queued run to its end (the slot is held until then).
async fn run_queued(runs: Arc<Runs>, mut place: QueuePlace, row: RunRow, spec: RunSpec) {
    let Some(_slot) = place.run_slot().await else {
        return;
    };
    let (agent, run) = (spec.agent.id.clone(), row.run_id.clone());
    match runs.start_queued_run(row, spec).await {
        Ok(started) => {
            if let Err(e) = started.done.await {
                tracing::error!(%agent, %run, error = %e, "webhook run task failed");
            }
        }
        Err(e) => tracing::warn!(%agent, %run, error = %e, "webhook run not started"),
    }
}

/// What a queued webhook run needs besides its row to start after a restart (`runs.resume`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Resume {
    pub agent_id: String,
    pub channel: String,
    /// The session's owner (`SessionIdent::tenant_id`).
    pub tenant_id: String,
    pub user_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

impl Resume {
    pub fn of(spec: &RunSpec) -> Self {
        Self {
            agent_id: spec.agent.id.clone(),
            channel: spec.session.channel.clone(),
            tenant_id: spec.session.tenant_id.clone(),
            user_id: spec.session.user_id.clone(),
            model: spec.model.clone(),
            timeout_ms: spec.timeout.map(|t| t.as_millis() as u64),
        }
    }
}

/// The run row of a webhook run, queued.
pub fn queued_row(spec: &RunSpec) -> RunRow {
    let run_id = format!("run_{}", uuid::Uuid::new_v4().simple());
    RunRow {
        root_run_id: run_id.clone(),
        run_id,
        agent_id: spec.agent.id.clone(),
        session_key: spec.session.key.clone(),
        task: spec.task.clone(),
        status: SubagentRunStatus::Queued.as_str().to_owned(),
        client_id: spec.caller.client_id.clone(),
        started_at: crate::clock::now_ms(),
        delivery: spec.delivery.clone(),
        ..RunRow::default()
    }
}

/// At start-up: the queued webhook runs a previous process acknowledged are queued again
/// (ahead of new deliveries, past the queue limit, since they were accepted already); when
/// webhooks are off, or a run's agent is gone or its record unreadable, the run is marked
/// failed with the reason. On a shared database the fleet reaper calls it every beat with the
/// same `live_since` its orphan sweep used.
pub async fn resume_queued(queue: Option<&RunQueue>, runs: &Arc<Runs>, live_since: Option<i64>) {
    let claimed = match runs.store().runs_claim_queued(live_since).await {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "queued webhook runs could not be read; they stay queued");
            return;
        }
    };
    if claimed.is_empty() {
        return;
    }
    tracing::info!(
        runs = claimed.len(),
        "resuming webhook runs queued before the restart"
    );
    for ResumableRun { row, resume } in claimed {
        let spec = match (queue, resumed_spec(runs, &row, &resume)) {
            (Some(_), Ok(spec)) => spec,
            (None, _) => {
                fail(
                    runs,
                    row,
                    "webhooks are disabled; the queued run was not resumed",
                )
                .await;
                continue;
            }
            (Some(_), Err(why)) => {
                fail(runs, row, &why).await;
                continue;
            }
        };
        if let Some(queue) = queue {
            let place = queue.reserve_owed();
            #[allow(
                clippy::disallowed_methods,
                reason = "a queued run ends with its turn; its row makes it resumable after a restart"
            )]
            tokio::spawn(run_queued(runs.clone(), place, row, spec));
        }
    }
}

fn resumed_spec(runs: &Runs, row: &RunRow, resume: &str) -> Result<RunSpec, String> {
    let r: Resume = serde_json::from_str(resume)
        .map_err(|e| format!("the queued run's record is unreadable ({e})"))?;
    let agent = runs
        .agents
        .require(&r.agent_id)
        .map_err(|e| format!("the queued run cannot start: {e}"))?;
    // The key as stored (`tenant_id` is the session's owner, not the key's tenant part).
    let session = SessionIdent::stored(
        row.session_key.clone(),
        r.agent_id.clone(),
        r.channel.clone(),
        r.tenant_id.clone(),
        r.user_id.clone(),
    );
    Ok(RunSpec {
        agent,
        session,
        task: row.task.clone(),
        caller: Principal::internal(&row.client_id).context(None),
        scopes: crate::api::scopes::Scopes::only(Scope::Rpc),
        parent: None,
        spawned: false,
        max_steps: None,
        model: r.model,
        only_tools: None,
        timeout: r.timeout_ms.map(Duration::from_millis),
        delivery: row.delivery.clone(),
    })
}

async fn fail(runs: &Runs, mut row: RunRow, why: &str) {
    tracing::warn!(run = %row.run_id, reason = why, "queued webhook run not resumed");
    row.status = SubagentRunStatus::Failed.as_str().to_owned();
    row.completed_at = Some(crate::clock::now_ms());
    row.error = Some(why.to_owned());
    if let Err(e) = runs.store().run_finish(&row).await {
        tracing::error!(run = %row.run_id, error = %e, "run outcome not recorded");
    }
}
