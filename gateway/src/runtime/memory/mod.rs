//! Long-term memory per tenant: the write path (injection checks, trust, background
//! embedding), hybrid recall (keyword, vector and entity lanes fused by reciprocal rank), the
//! embedding caches and breaker, recall counters, consolidation and `memory.ask`.
//!
//! The state of one server generation lives in [`MemoryState`] (opened by the composition
//! root); [`Memory`] is the service over it, holding the handles its operations use (the
//! store, the agents, the model calls, the event bus). Its operations are in the submodules:
//! writes in `write.rs`, recall in `recall.rs`, consolidation and `memory.ask` in
//! `consolidate.rs`; the background worker holds the service weakly.

pub mod consolidate;
pub mod files;
pub mod fuse;
pub mod guard;
pub mod index;
pub mod portable;
pub mod recall;
pub mod worker;
pub mod write;

use std::collections::{HashMap, HashSet};
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use sha2::{Digest, Sha256};

use crate::config::memory::MemoryConfig;
use crate::runtime::agents::Agents;
use crate::runtime::calls::ModelCalls;
use crate::runtime::control::Control;
use crate::store::Store;

/// Long-term memory of one generation: its state and exactly the handles its operations use.
pub struct Memory {
    pub state: Arc<MemoryState>,
    store: Store,
    /// The agent whose model consolidates and answers `memory.ask`.
    agents: Arc<Agents>,
    /// Embeddings and the consolidation and answer calls.
    calls: ModelCalls,
    /// The event bus (`memory:*` events).
    control: Arc<Control>,
}

impl Memory {
    pub fn new(
        state: Arc<MemoryState>,
        store: Store,
        agents: Arc<Agents>,
        calls: ModelCalls,
        control: Arc<Control>,
    ) -> Self {
        Self {
            state,
            store,
            agents,
            calls,
            control,
        }
    }
}

/// Consecutive embedding failures that open the breaker.
const BREAKER_THRESHOLD: u64 = 5;
/// How long an open breaker refuses calls before one probe is let through.
const BREAKER_COOL_MS: i64 = 30_000;

/// Recall counters of one (tenant, agent) since the daemon started.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RecallCounters {
    pub fts: i64,
    pub vector: i64,
    pub entity: i64,
    pub recalls: i64,
    pub with_hits: i64,
    pub clusters: i64,
    pub observations: i64,
}

impl RecallCounters {
    fn add(&mut self, o: &RecallCounters) {
        self.fts += o.fts;
        self.vector += o.vector;
        self.entity += o.entity;
        self.recalls += o.recalls;
        self.with_hits += o.with_hits;
        self.clusters += o.clusters;
        self.observations += o.observations;
    }
}

/// The breaker in front of the embedding model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    Closed,
    Open,
    HalfOpen,
}

#[derive(Debug, Default)]
struct Breaker {
    failures: u64,
    opened_at: Option<i64>,
}

/// Cache hit and miss counters of one tier.
#[derive(Debug, Default)]
pub struct TierCounters {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
}

impl TierCounters {
    fn hit(&self, yes: bool) {
        let c = if yes { &self.hits } else { &self.misses };
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// Memory state of one server generation.
pub struct MemoryState {
    pub config: MemoryConfig,
    /// Vectors of every embedded entry of the configured model.
    pub index: RwLock<index::VectorIndex>,
    /// Whether the index holds every stored vector (loading happens in the background).
    pub index_loaded: AtomicBool,
    l1: Mutex<lru::LruCache<String, Arc<Vec<f32>>>>,
    pub l1_counters: TierCounters,
    pub l2_counters: TierCounters,
    breaker: Mutex<Breaker>,
    /// Ids waiting for their embedding (set by the worker when it starts).
    queue: Mutex<Option<tokio::sync::mpsc::Sender<i64>>>,
    /// Set when an id could not be queued: the worker sweeps the table for it.
    pub overflowed: AtomicBool,
    counters: Mutex<HashMap<(String, String), RecallCounters>>,
    /// Scopes (tenant, agent) being consolidated now.
    consolidating: Mutex<HashSet<(String, String)>>,
    /// Scopes (tenant, agent) that may be due for a consolidation, for the worker (set when it
    /// starts; the worker holds the engine, so memory never points back at it).
    consolidations: Mutex<Option<tokio::sync::mpsc::Sender<(String, String)>>>,
}

impl MemoryState {
    pub fn new(config: MemoryConfig) -> Arc<Self> {
        let cap = NonZeroUsize::new(config.cache_entries.max(1)).unwrap_or(NonZeroUsize::MIN);
        let memory = Arc::new(Self {
            config,
            index: RwLock::new(index::VectorIndex::new()),
            index_loaded: AtomicBool::new(false),
            l1: Mutex::new(lru::LruCache::new(cap)),
            l1_counters: TierCounters::default(),
            l2_counters: TierCounters::default(),
            breaker: Mutex::new(Breaker::default()),
            queue: Mutex::new(None),
            overflowed: AtomicBool::new(false),
            counters: Mutex::new(HashMap::new()),
            consolidating: Mutex::new(HashSet::new()),
            consolidations: Mutex::new(None),
        });
        // The per-tenant gauge on /metrics reads the index at each scrape.
        let sizes: Arc<dyn crate::metrics::IndexSizes> = memory.clone();
        crate::metrics::watch_memory_index(&sizes);
        memory
    }

    /// The embedding model of the vector lane; None when it is turned off.
    pub fn model(&self) -> Option<&str> {
        (!self.config.embedding_model.is_empty()).then_some(self.config.embedding_model.as_str())
    }

    /// Asks the worker to embed entry `id`; never waits. A full queue is remembered so that
    /// the worker sweeps for the entry instead.
    pub fn enqueue(&self, id: i64) {
        let sent = self
            .queue
            .lock()
            .ok()
            .and_then(|q| q.as_ref().map(|tx| tx.try_send(id).is_ok()))
            .unwrap_or(false);
        if !sent {
            self.overflowed.store(true, Ordering::Relaxed);
        }
    }

    pub(crate) fn set_queue(&self, tx: tokio::sync::mpsc::Sender<i64>) {
        if let Ok(mut q) = self.queue.lock() {
            *q = Some(tx);
        }
    }

    /// Tells the worker that (owner, agent) may be due for a consolidation; never waits. A full
    /// queue drops the hint: the next write of that scope gives it again.
    pub fn hint_consolidation(&self, owner: &str, agent: &str) {
        if let Ok(q) = self.consolidations.lock() {
            if let Some(tx) = q.as_ref() {
                let _ = tx.try_send((owner.to_owned(), agent.to_owned()));
            }
        }
    }

    pub(crate) fn set_consolidations(&self, tx: tokio::sync::mpsc::Sender<(String, String)>) {
        if let Ok(mut q) = self.consolidations.lock() {
            *q = Some(tx);
        }
    }

    /// An embedding from the in-memory tier.
    pub fn l1_get(&self, hash: &str) -> Option<Arc<Vec<f32>>> {
        let got = self.l1.lock().ok().and_then(|mut c| c.get(hash).cloned());
        self.l1_counters.hit(got.is_some());
        got
    }

    pub fn l1_put(&self, hash: String, v: Arc<Vec<f32>>) {
        if self.config.cache_entries == 0 {
            return;
        }
        if let Ok(mut c) = self.l1.lock() {
            c.put(hash, v);
        }
    }

    /// (entries, capacity) of the in-memory tier.
    pub fn l1_size(&self) -> (usize, usize) {
        self.l1
            .lock()
            .map(|c| (c.len(), c.cap().get()))
            .unwrap_or((0, 0))
    }

    /// Whether a call to the embedding model may be made now (closed, or open long enough to
    /// probe).
    pub fn breaker_allows(&self, now: i64) -> bool {
        self.breaker
            .lock()
            .map(|b| b.opened_at.is_none_or(|t| now - t >= BREAKER_COOL_MS))
            .unwrap_or(true)
    }

    pub fn breaker_record(&self, ok: bool, now: i64) {
        if let Ok(mut b) = self.breaker.lock() {
            if ok {
                b.failures = 0;
                b.opened_at = None;
            } else {
                b.failures += 1;
                if b.failures >= BREAKER_THRESHOLD {
                    b.opened_at = Some(now);
                }
            }
        }
    }

    /// The breaker's state, consecutive failures and when it opened.
    pub fn breaker_state(&self, now: i64) -> (BreakerState, u64, Option<i64>) {
        self.breaker
            .lock()
            .map(|b| {
                let state = match b.opened_at {
                    None => BreakerState::Closed,
                    Some(t) if now - t >= BREAKER_COOL_MS => BreakerState::HalfOpen,
                    Some(_) => BreakerState::Open,
                };
                (state, b.failures, b.opened_at)
            })
            .unwrap_or((BreakerState::Closed, 0, None))
    }

    /// Adds to the counters of (tenant, agent).
    pub fn count(&self, tenant: &str, agent: &str, f: impl FnOnce(&mut RecallCounters)) {
        if let Ok(mut c) = self.counters.lock() {
            f(c.entry((tenant.to_owned(), agent.to_owned())).or_default());
        }
    }

    /// The counters of a tenant, of one agent or summed over all of them.
    pub fn counters(&self, tenant: &str, agent: Option<&str>) -> RecallCounters {
        let mut sum = RecallCounters::default();
        if let Ok(c) = self.counters.lock() {
            for ((t, a), v) in c.iter() {
                if t == tenant && agent.is_none_or(|x| x == a) {
                    sum.add(v);
                }
            }
        }
        sum
    }

    /// Marks a scope as being consolidated; false when it already is.
    pub fn begin_consolidation(&self, tenant: &str, agent: &str) -> bool {
        self.consolidating
            .lock()
            .map(|mut s| s.insert((tenant.to_owned(), agent.to_owned())))
            .unwrap_or(false)
    }

    pub fn end_consolidation(&self, tenant: &str, agent: &str) {
        if let Ok(mut s) = self.consolidating.lock() {
            s.remove(&(tenant.to_owned(), agent.to_owned()));
        }
    }

    /// Drops entries from the vector index.
    pub fn unindex(&self, ids: &[i64]) {
        if let Ok(mut ix) = self.index.write() {
            for id in ids {
                ix.remove(*id);
            }
        }
    }
}

/// Hex SHA-256 of a text: the key of both cache tiers.
pub fn content_hash(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

/// Words too common to say anything in a keyword search (English).
const STOP_WORDS: &[&str] = &[
    "a", "about", "after", "all", "also", "am", "an", "and", "any", "are", "as", "at", "be",
    "been", "before", "but", "by", "can", "could", "did", "do", "does", "for", "from", "had",
    "has", "have", "he", "her", "here", "him", "his", "how", "i", "if", "in", "into", "is", "it",
    "its", "me", "my", "no", "not", "of", "on", "or", "our", "she", "so", "than", "that", "the",
    "their", "them", "then", "there", "these", "they", "this", "those", "to", "up", "us", "was",
    "we", "were", "what", "when", "where", "which", "who", "whom", "why", "will", "with", "would",
    "you", "your",
];

/// The words of a query worth a keyword search: without stop words (all of them when nothing
/// else is left), so that "the" alone never ranks an entry first.
pub fn keyword_text(query: &str) -> String {
    let words: Vec<&str> = query
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect();
    let kept: Vec<&str> = words
        .iter()
        .copied()
        .filter(|w| !STOP_WORDS.contains(&w.to_lowercase().as_str()))
        .collect();
    if kept.is_empty() {
        words.join(" ")
    } else {
        kept.join(" ")
    }
}

/// At most `max` characters of `s`.
pub fn preview(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => s[..i].to_owned(),
        None => s.to_owned(),
    }
}

impl crate::metrics::IndexSizes for MemoryState {
    fn each_tenant(&self, each: &mut dyn FnMut(&str, usize)) {
        let Ok(index) = self.index.read() else {
            return;
        };
        for (tenant, entries) in index.tenant_entries() {
            each(tenant, entries);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::normalise_name;

    #[test]
    fn keyword_text_drops_stop_words_unless_nothing_is_left() {
        assert_eq!(keyword_text("Where is the cat?"), "cat");
        assert_eq!(keyword_text("is the"), "is the");
    }

    #[test]
    fn names_normalise_to_lowercase_words() {
        assert_eq!(
            normalise_name("  Dr. Anna-Lena  MÜLLER "),
            "dr anna lena müller"
        );
        assert_eq!(preview("héllo", 2), "hé");
    }

    #[test]
    fn the_breaker_opens_after_repeated_failures_and_probes_later() {
        let m = MemoryState::new(MemoryConfig::default());
        for _ in 0..BREAKER_THRESHOLD {
            assert!(m.breaker_allows(0));
            m.breaker_record(false, 0);
        }
        assert!(!m.breaker_allows(1));
        assert_eq!(m.breaker_state(1).0, BreakerState::Open);
        assert!(m.breaker_allows(BREAKER_COOL_MS));
        assert_eq!(m.breaker_state(BREAKER_COOL_MS).0, BreakerState::HalfOpen);
        m.breaker_record(true, BREAKER_COOL_MS);
        assert_eq!(m.breaker_state(BREAKER_COOL_MS).0, BreakerState::Closed);
    }
}
