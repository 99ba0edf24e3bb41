//! The embedding worker of one server generation: loads the stored vectors into the index,
//! then embeds queued entries (and, after a full queue or a failure, sweeps the table for
//! entries still without a vector of the configured model). Also sweeps old recall records.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::recall::NotEmbedded;
use super::Memory;
use crate::clock::now_ms;
use crate::store::memory::Unembedded;

/// Vectors read per page when the index is loaded.
const LOAD_PAGE: i64 = 5_000;
/// How long the worker waits before trying again when the model is not there.
const RETRY: Duration = Duration::from_secs(2);
/// How often the table is swept anyway (and old recall records deleted).
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// Consolidation hints waiting at most (one per memory write of a scope; duplicates are cheap).
const CONSOLIDATION_HINTS: usize = 256;

/// Starts the worker; it ends with `stop` or when the memory service is dropped.
pub fn start(memory: &Arc<Memory>, stop: CancellationToken) {
    let (tx, rx) = tokio::sync::mpsc::channel(memory.state.config.embed_queue.max(1));
    memory.state.set_queue(tx);
    let (hints, hinted) = tokio::sync::mpsc::channel(CONSOLIDATION_HINTS);
    memory.state.set_consolidations(hints);
    #[allow(
        clippy::disallowed_methods,
        reason = "the generation's consolidation loop: it holds the memory service weakly and ends on the generation's stop token"
    )]
    tokio::spawn(consolidations(Arc::downgrade(memory), hinted, stop.clone()));
    let weak = Arc::downgrade(memory);
    #[allow(
        clippy::disallowed_methods,
        reason = "the generation's embedding worker: it holds the memory service weakly and ends on the generation's stop token"
    )]
    tokio::spawn(async move {
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = run(weak, rx) => {}
        }
    });
}

async fn run(memory: Weak<Memory>, mut rx: tokio::sync::mpsc::Receiver<i64>) {
    let Some(e) = memory.upgrade() else { return };
    let Some(model) = e.state.model().map(str::to_owned) else {
        // No vector lane: nothing to embed; the queue is drained so that senders never block
        // (they never do: try_send), and old recall records are still swept.
        drop(e);
        loop {
            tokio::select! {
                got = rx.recv() => if got.is_none() { return },
                _ = tokio::time::sleep(SWEEP_EVERY) => {
                    let Some(e) = memory.upgrade() else { return };
                    sweep_recalls(&e).await;
                }
            }
        }
    };
    load_index(&e, &model).await;
    drop(e);
    let mut dirty = true;
    loop {
        if dirty {
            let Some(e) = memory.upgrade() else { return };
            dirty = !sweep(&e, &model).await;
        }
        let wait = if dirty { RETRY } else { SWEEP_EVERY };
        let first = tokio::select! {
            got = rx.recv() => match got { Some(id) => Some(id), None => return },
            _ = tokio::time::sleep(wait) => None,
        };
        let Some(e) = memory.upgrade() else { return };
        let Some(first) = first else {
            sweep_recalls(&e).await;
            dirty = true;
            continue;
        };
        let batch_max = e.state.config.embed_batch.max(1);
        let mut ids = vec![first];
        while ids.len() < batch_max {
            match rx.try_recv() {
                Ok(id) => ids.push(id),
                Err(_) => break,
            }
        }
        if e.state.overflowed.swap(false, Ordering::Relaxed) {
            dirty = true;
        }
        match e.store.memory_for_embedding(&ids).await {
            Ok(rows) => {
                if !embed_rows(&e, &model, &rows).await {
                    dirty = true;
                }
            }
            Err(err) => {
                tracing::warn!(error = %err, "memory entries not read for embedding");
                dirty = true;
            }
        }
    }
}

/// Reads every stored vector of `model` into the index.
async fn load_index(e: &Memory, model: &str) {
    let mut after = 0;
    let mut loaded = 0usize;
    loop {
        match e.store.memory_vectors(model, after, LOAD_PAGE).await {
            Ok(page) if page.is_empty() => break,
            Ok(page) => {
                after = page.last().map_or(after, |v| v.id);
                if let Ok(mut ix) = e.state.index.write() {
                    for v in &page {
                        ix.upsert(&v.tenant_id, &v.agent_id, v.id, &v.vector);
                    }
                }
                loaded += page.len();
            }
            Err(err) => {
                tracing::error!(error = %err, "memory vectors not loaded; vector recall is partial");
                break;
            }
        }
    }
    e.state.index_loaded.store(true, Ordering::Relaxed);
    tracing::info!(entries = loaded, "memory vector index loaded");
}

/// Embeds every entry still without a vector of `model`; false when it had to stop (model not
/// available or failing), so that the caller tries again later.
async fn sweep(e: &Memory, model: &str) -> bool {
    let mut after = 0;
    loop {
        if !e.embedder_ready() && !local_loading_can_start(e) {
            return false;
        }
        let page = match e
            .store
            .memory_unembedded(model, after, e.state.config.embed_batch.max(1) as i64)
            .await
        {
            Ok(p) => p,
            Err(err) => {
                tracing::warn!(error = %err, "unembedded memory entries not read");
                return false;
            }
        };
        let Some(last) = page.last() else {
            return true;
        };
        after = last.id;
        if !embed_rows(e, model, &page).await {
            return false;
        }
    }
}

/// Whether calling the model would start loading it (the local provider before its first
/// use): the sweep then makes that call instead of waiting forever.
fn local_loading_can_start(e: &Memory) -> bool {
    let Some(name) = e.state.model() else {
        return false;
    };
    let snap = e.calls.providers().snapshot();
    snap.model(name).is_some_and(|m| {
        m.provider == "local"
            && snap.providers.get(&m.provider).is_some_and(|p| p.enabled())
            && e.state.breaker_allows(now_ms())
    })
}

/// Embeds `rows`, stores their vectors and indexes them; false when the model failed.
async fn embed_rows(e: &Memory, model: &str, rows: &[Unembedded]) -> bool {
    if rows.is_empty() {
        return true;
    }
    let texts: Vec<String> = rows.iter().map(|r| r.content.clone()).collect();
    let vectors = match e.embed_texts(&texts).await {
        Ok(v) => v,
        Err(NotEmbedded::Unavailable) => return false,
        Err(NotEmbedded::Failed(err)) => {
            tracing::warn!(error = %err, "memory entries not embedded; retrying later");
            return false;
        }
    };
    let pairs: Vec<(i64, Vec<f32>)> = rows
        .iter()
        .zip(&vectors)
        .map(|(r, v)| (r.id, (**v).clone()))
        .collect();
    // An entry deleted while it was embedded was not updated, and must not come back into
    // the index.
    let still = match e.store.memory_set_embeddings(model, &pairs).await {
        Ok(ids) => ids,
        Err(err) => {
            tracing::warn!(error = %err, "memory embeddings not stored");
            return false;
        }
    };
    if let Ok(mut ix) = e.state.index.write() {
        for (r, v) in rows.iter().zip(&vectors) {
            if still.contains(&r.id) {
                ix.upsert(&r.tenant_id, &r.agent_id, r.id, v);
            }
        }
    }
    true
}

async fn sweep_recalls(e: &Memory) {
    // Checked although the configuration caps the hours: a cut-off that cannot be computed
    // sweeps nothing rather than everything.
    let Some(before) = i64::from(e.state.config.recall_retention_hours)
        .checked_mul(3_600_000)
        .and_then(|keep_ms| now_ms().checked_sub(keep_ms))
    else {
        return;
    };
    if let Err(err) = e.store.memory_recalls_sweep(before).await {
        tracing::warn!(error = %err, "old recall records not swept");
    }
}

/// Runs a consolidation check per hint, each on a task of its own (a consolidation calls a
/// model; the memory state lets only one run per scope).
async fn consolidations(
    memory: Weak<Memory>,
    mut hinted: tokio::sync::mpsc::Receiver<(String, String)>,
    stop: CancellationToken,
) {
    loop {
        let (owner, agent) = tokio::select! {
            _ = stop.cancelled() => return,
            got = hinted.recv() => match got { Some(h) => h, None => return },
        };
        let Some(memory) = memory.upgrade() else {
            return;
        };
        #[allow(
            clippy::disallowed_methods,
            reason = "one consolidation per tenant and agent, ended by its provider call's timeout"
        )]
        tokio::spawn(async move { memory.consolidate_if_due(&owner, &agent).await });
    }
}
