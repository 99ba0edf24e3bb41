//! The scheduler: cron jobs that send a message to an agent at set times, per-agent
//! heartbeats, the wake coalescer, and wake gates.
//!
//! All of its state is in the store (`store/scheduler.rs`), so it is the same on every node of
//! a fleet and survives a kill -9. One timer task per server generation and node sleeps until
//! the earliest due time (never polling: at most [`MAX_SLEEP`] between two looks at the wall
//! clock) and is re-armed through [`rearm`] by every change that can move that time, on this
//! node or, through the fan-out, on another. A due time is fired by whichever node claims it
//! first (a conditional update), so every due time fires once.

pub mod beat;
pub mod fire;
pub mod gate;
pub mod jobs;
pub mod schedule;
pub mod timer;

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::config::scheduler::SchedulerConfig;
use crate::providers::registry::Providers;
use crate::runtime::agents::Agents;
use crate::runtime::control::Control;
use crate::runtime::runs::Runs;
use crate::store::Store;

/// The scheduler of one server generation: cron jobs and heartbeats over the store, firing
/// through background runs. It holds exactly the handles it uses.
pub struct Scheduler {
    /// `scheduler`: the timer settings, file jobs and heartbeat defaults of this generation.
    pub config: SchedulerConfig,
    store: Store,
    agents: Arc<Agents>,
    /// The catalogue a heartbeat change is checked against.
    providers: Arc<Providers>,
    /// Re-arming, fire slots and the event bus.
    control: Arc<Control>,
    /// Fires and ticks run as background runs.
    runs: Arc<Runs>,
    /// Where agents' workspaces and wake gates' homes are.
    data_dir: PathBuf,
    /// Agents with `adminTrust` in this node's configuration file: the wake gates of the
    /// file's jobs for them hold scope admin on the capability socket.
    trusted: std::collections::BTreeSet<String>,
}

impl Scheduler {
    #[allow(clippy::too_many_arguments, reason = "the services of one generation")]
    pub fn new(
        config: SchedulerConfig,
        store: Store,
        agents: Arc<Agents>,
        providers: Arc<Providers>,
        control: Arc<Control>,
        runs: Arc<Runs>,
        data_dir: PathBuf,
        trusted: std::collections::BTreeSet<String>,
    ) -> Self {
        Self {
            config,
            store,
            agents,
            providers,
            control,
            runs,
            data_dir,
            trusted,
        }
    }

    /// The scopes a job's wake gate holds on the capability socket: `rpc`, or `admin` for a
    /// job of the configuration file whose agent has `adminTrust` there (both file-only: the
    /// operator's own decision, never an API token's).
    pub fn gate_scopes(&self, job_owner: &str, agent_id: &str) -> crate::api::scopes::Scopes {
        use crate::api::generated::methods::Scope;
        if job_owner == crate::store::scheduler::CONFIG_OWNER && self.trusted.contains(agent_id) {
            crate::api::scopes::Scopes::from([Scope::Admin, Scope::Rpc])
        } else {
            crate::api::scopes::Scopes::only(Scope::Rpc)
        }
    }
}

/// The longest the timer sleeps without looking at the wall clock (a clock set forward while
/// it slept is noticed within this time).
pub const MAX_SLEEP: std::time::Duration = std::time::Duration::from_secs(300);

/// The `fanout` control message that re-arms other nodes' timers.
pub const ANNOUNCE: &str = "scheduler";

/// Wakes this node's timers (and, on a shared database, every node's) to look at the due times
/// again.
pub fn rearm(control: &Control) {
    control
        .scheduler_epoch
        .send_modify(|e| *e = e.wrapping_add(1));
}

/// Fires and ticks running at once on this node, across server generations, bounded by
/// `scheduler.maxConcurrentRuns` of the generation that takes a slot.
#[derive(Default)]
pub struct FireSlots {
    running: AtomicUsize,
}

/// A slot held by one fire or tick; released (and the timer re-armed) when dropped.
pub struct Slot {
    control: Arc<Control>,
}

impl FireSlots {
    /// A slot when fewer than `max` are taken.
    pub fn take(control: &Arc<Control>, max: usize) -> Option<Slot> {
        let slots = &control.fire_slots;
        let mut now = slots.running.load(Ordering::Relaxed);
        loop {
            if now >= max {
                return None;
            }
            match slots.running.compare_exchange_weak(
                now,
                now + 1,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    return Some(Slot {
                        control: control.clone(),
                    })
                }
                Err(seen) => now = seen,
            }
        }
    }

    /// Slots taken now.
    pub fn running(&self) -> usize {
        self.running.load(Ordering::Relaxed)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.control
            .fire_slots
            .running
            .fetch_sub(1, Ordering::AcqRel);
        rearm(&self.control);
    }
}

impl Scheduler {
    /// A scheduled turn (a cron fire or a heartbeat tick) as a background run of `caller`, with
    /// `rpc` tools only whoever set it up, ended after `scheduler.fireTimeoutMs`.
    pub(crate) fn scheduled_run(
        &self,
        agent: Arc<crate::runtime::agents::Agent>,
        session: crate::runtime::sessions::SessionIdent,
        task: String,
        caller: &str,
        model: Option<String>,
    ) -> crate::runtime::runs::RunSpec {
        crate::runtime::runs::RunSpec {
            agent,
            session,
            task,
            caller: crate::api::principal::Principal::internal(caller).context(None),
            scopes: crate::api::scopes::Scopes::only(crate::api::generated::methods::Scope::Rpc),
            parent: None,
            spawned: false,
            max_steps: None,
            model,
            only_tools: None,
            timeout: Some(std::time::Duration::from_millis(
                self.config.fire_timeout_ms,
            )),
            delivery: None,
        }
    }
}

/// Why a scheduled turn that ended with `finishReason: error` failed, for run records.
pub(crate) fn failure_text(t: &crate::runtime::turn::TurnOutcome) -> String {
    match t.failure {
        Some(f) => format!(
            "the model call failed: {:?}{}",
            f.kind,
            f.status.map(|s| format!(" (HTTP {s})")).unwrap_or_default()
        ),
        None => "the turn ended with finishReason error".into(),
    }
}

/// At most `max` characters of `text`, with `…` where it was cut.
pub(crate) fn clip(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.to_owned(),
    }
}

/// A short, single-line excerpt of an agent's answer for a run record.
pub(crate) fn summary_of(text: &str) -> String {
    let flat: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    clip(flat.trim(), 200)
}
