//! A server generation's part in the fleet of nodes sharing its database: it follows registry
//! changes made elsewhere (reloading agents and providers), and, on a shared database, marks
//! this node alive and takes over what dead nodes left (the reaper). The tasks end with their
//! generation (they hold it weakly).

use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::clock::now_ms;
use crate::config::store::StoreConfig;
use crate::runtime::engine::Engine;
use crate::webhooks::Webhooks;

/// Every node reloads agents and providers this often on a shared database, whether or not
/// a change notification arrived (a missed notification heals within this time).
pub const RESYNC_EVERY: Duration = Duration::from_secs(30);

/// Starts the generation's fleet tasks.
pub fn follow(engine: &Arc<Engine>, hooks: Option<Arc<Webhooks>>, store: &StoreConfig) {
    #[allow(
        clippy::disallowed_methods,
        reason = "the node follower holds the generation weakly and ends with it"
    )]
    tokio::spawn(reload_on_change(Arc::downgrade(engine)));
    if engine.store.is_shared() {
        let beat = Duration::from_millis(store.node_heartbeat_ms);
        #[allow(
            clippy::disallowed_methods,
            reason = "the node follower holds the generation weakly and ends with it"
        )]
        tokio::spawn(reaper(Arc::downgrade(engine), hooks, beat));
    }
}

/// Reloads the registries when another node changed them (or the fan-out reconnected), and
/// every [`RESYNC_EVERY`] on a shared database.
async fn reload_on_change(engine: Weak<Engine>) {
    let Some(mut changes) = engine
        .upgrade()
        .map(|e| e.control.registry_epoch.subscribe())
    else {
        return;
    };
    changes.mark_unchanged();
    // On a shared database the first round reloads at once: a change another node made
    // between this generation's load and this subscription was announced to nobody here.
    let mut first = true;
    loop {
        let shared = match engine.upgrade() {
            Some(e) => e.store.is_shared(),
            None => return,
        };
        if !(first && shared) {
            tokio::select! {
                changed = changes.changed() => if changed.is_err() { return },
                _ = tokio::time::sleep(RESYNC_EVERY), if shared => {}
            }
        }
        first = false;
        let Some(engine) = engine.upgrade() else {
            return;
        };
        // Secrets before providers: a provider's key is resolved when it is rebuilt.
        for (what, reloaded) in [
            ("secrets", engine.secrets.reload().await),
            ("tokens", engine.api_tokens.reload().await),
            ("agents", engine.agents.reload().await),
            ("providers", engine.providers.reload().await),
        ] {
            if let Err(e) = reloaded {
                tracing::warn!(what, error = %e, "registry not reloaded; retried at the next change");
            }
        }
    }
}

/// On a shared database, every `beat`: this node is alive; runs held by dead nodes are
/// orphaned (running) or taken over (queued webhook runs, when this node serves webhooks), and
/// the graph runs they held fail; once per fleet (lease), old fan-out bodies and long-dead
/// nodes are forgotten.
async fn reaper(engine: Weak<Engine>, hooks: Option<Arc<Webhooks>>, beat: Duration) {
    loop {
        tokio::time::sleep(beat).await;
        let Some(engine) = engine.upgrade() else {
            return;
        };
        let store = &engine.store;
        let now = now_ms();
        // One verdict on which nodes are dead for the whole beat: a queued run must not be
        // taken over from a node whose running runs the orphan sweep still counted as held.
        let live_since = store.live_since();
        if let Err(e) = store.node_seen(now, engine.control.started_at_ms).await {
            tracing::warn!(error = %e, "node heartbeat not recorded");
            continue;
        }
        match store.runs_orphan_unresumable(now, live_since).await {
            Ok(0) => {}
            Ok(n) => tracing::warn!(
                orphaned = n,
                "runs of a node that stopped are marked orphaned"
            ),
            Err(e) => tracing::warn!(error = %e, "orphan sweep failed"),
        }
        match store.graph_runs_orphan(now, live_since).await {
            Ok(0) => {}
            Ok(n) => tracing::warn!(
                failed = n,
                "graph runs of a node that stopped are marked failed"
            ),
            Err(e) => tracing::warn!(error = %e, "graph run orphan sweep failed"),
        }
        match store.scheduler_release_dead(now, live_since).await {
            Ok(0) => {}
            Ok(n) => {
                tracing::warn!(
                    released = n,
                    "cron fires of a node that stopped are released"
                );
                crate::runtime::scheduler::rearm(&engine.control);
            }
            Err(e) => tracing::warn!(error = %e, "scheduler sweep failed"),
        }
        if hooks.is_some() {
            crate::runtime::queue::resume_queued(
                hooks.as_deref().map(|h| &h.queue),
                &engine.runs,
                live_since,
            )
            .await;
        }
        let ttl = i64::try_from(beat.as_millis()).unwrap_or(i64::MAX);
        if let Ok(true) = store.lease_claim("fleet_sweep", now, ttl).await {
            let swept = store
                .fanout_sweep(now - crate::fanout::SPILL_KEEP_MS)
                .await
                .and(store.nodes_forget(now - 24 * 3600 * 1000).await);
            if let Err(e) = swept {
                tracing::warn!(error = %e, "fleet sweep failed");
            }
        }
    }
}
