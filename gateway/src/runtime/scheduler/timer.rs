//! The timer: one task per server generation and node that sleeps until the earliest due time
//! of any job or heartbeat, fires what is due while fire slots are free, and sleeps again. It
//! is re-armed (woken early) by every change that can move the earliest due time.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::Scheduler;
use crate::clock::now_ms;
use crate::runtime::scheduler::MAX_SLEEP;

/// Starts the generation's timer (nothing when `scheduler.enabled` is false). It ends when the
/// generation stops or its scheduler is dropped.
pub fn start(scheduler: &Arc<Scheduler>, stop: CancellationToken) {
    if !scheduler.config.enabled {
        return;
    }
    let weak = Arc::downgrade(scheduler);
    let mut epoch = scheduler.control.scheduler_epoch.subscribe();
    #[allow(
        clippy::disallowed_methods,
        reason = "the generation's timer: it holds the scheduler weakly and ends on the generation's stop token"
    )]
    tokio::spawn(async move {
        if let Some(scheduler) = weak.upgrade() {
            if let Err(e) = scheduler.sync_heartbeats().await {
                tracing::warn!(error = %e, "heartbeat schedules not synchronised");
            }
        }
        let mut pruned_at: Option<Instant> = None;
        loop {
            epoch.mark_unchanged();
            if pruned_at.is_none_or(|t| t.elapsed() >= PRUNE_EVERY) {
                pruned_at = Some(Instant::now());
                prune(&weak).await;
            }
            let wait = match pass(&weak).await {
                Some(w) => w,
                None => return,
            };
            let (slept_at, wall_at) = (Instant::now(), now_ms());
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(wait) => {}
                changed = epoch.changed() => if changed.is_err() { return },
            }
            // The sleep is monotonic and due times are wall-clock instants: a clock that was
            // set while the task slept is seen here, and the next pass reads the due times again.
            let mono = i64::try_from(slept_at.elapsed().as_millis()).unwrap_or(i64::MAX);
            let wall = now_ms() - wall_at;
            if (wall - mono).abs() > 1_000 {
                tracing::info!(moved_ms = wall - mono, "wall clock moved; schedule re-read");
            }
        }
    });
}

/// How often finished fires older than `runRetention.maxAgeDays` are deleted.
const PRUNE_EVERY: Duration = Duration::from_secs(3600);

/// Deletes old run records (removed jobs' too); once per fleet and hour on a shared database.
async fn prune(weak: &Weak<Scheduler>) {
    let Some(scheduler) = weak.upgrade() else {
        return;
    };
    let now = now_ms();
    let ttl = i64::try_from(PRUNE_EVERY.as_millis()).unwrap_or(i64::MAX);
    if !scheduler
        .store
        .takes_turn("scheduler_prune", now, ttl)
        .await
    {
        return;
    }
    let age = i64::from(scheduler.config.run_retention.max_age_days) * 24 * 3600 * 1000;
    match scheduler.store.cron_prune(now - age).await {
        Ok(0) => {}
        Ok(n) => tracing::info!(removed = n, "old cron run records removed"),
        Err(e) => tracing::warn!(error = %e, "cron run records not pruned"),
    }
}

/// One look at the due times: fires what is due (while slots are free) and answers how long
/// to sleep; None when the generation is gone.
async fn pass(weak: &Weak<Scheduler>) -> Option<Duration> {
    let scheduler = weak.upgrade()?;
    let now = now_ms();
    let next = match due_pass(&scheduler, now).await {
        Ok(next) => next,
        Err(e) => {
            tracing::warn!(error = %e, "scheduler pass failed; retrying");
            Some(now + 1_000)
        }
    };
    let wait = match next {
        Some(t) => u64::try_from(t - now_ms()).unwrap_or(0),
        None => u64::MAX,
    };
    Some(Duration::from_millis(wait).min(MAX_SLEEP))
}

/// Fires due jobs and ticks; the earliest due time left (None: nothing scheduled). Due work
/// that waits for a slot answers a second from now; a slot's release re-arms the timer sooner.
async fn due_pass(
    scheduler: &Arc<Scheduler>,
    now: i64,
) -> Result<Option<i64>, crate::api::error::GatewayError> {
    let max = scheduler.fire_limit();
    scheduler.fire_due(now, None, None).await?;
    let beats_next = scheduler.beat_pass(now, max).await?;
    let cron_next = scheduler.store.cron_earliest().await?;
    let next = [cron_next, beats_next].into_iter().flatten().min();
    // Due work left behind a full set of slots waits for a slot: its release re-arms the
    // timer. The one-second bound covers a release by another generation, and a due row this
    // node could not claim (another node holds it).
    Ok(match next {
        Some(t) if t <= now_ms() => Some(now_ms() + 1_000),
        other => other,
    })
}
