//! Hybrid recall: the keyword lane (FTS5 bm25 / tsvector), the vector lane (cosine over the
//! tenant's vectors in memory) and the entity lane, fused by reciprocal rank; and the embedding
//! of texts through both cache tiers and the breaker.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::{Arc, RwLock};
use std::time::Instant;

use tokio_util::sync::CancellationToken;

use super::index::VectorIndex;
use super::Memory;
use super::{content_hash, fuse, keyword_text};
use crate::api::error::GatewayError;
use crate::api::tenancy::Tenant;
use crate::clock::now_ms;
use crate::runtime::calls::EmbedError;
use crate::store::memory::{MemoryRow, RecallRecord};
use crate::store::search::MemoryHit;
use crate::store::Store;

/// Where a recall was made, for its record.
#[derive(Debug, Clone, Default)]
pub struct RecallFor<'a> {
    /// The recalling agent; None for a tenant-wide search (memory.search, REST).
    pub agent: Option<&'a str>,
    pub session_key: Option<&'a str>,
    pub trace_id: Option<&'a str>,
}

/// One recalled entry and its fused score in (0, 1].
#[derive(Debug, Clone, PartialEq)]
pub struct Hit {
    pub row: MemoryRow,
    pub score: f64,
}

/// What a recall found and how.
#[derive(Debug, Clone, Default)]
pub struct Recall {
    pub hits: Vec<Hit>,
    /// Lanes that ran: fts, vector, entity.
    pub lanes: Vec<&'static str>,
}

/// Why texts could not be embedded now.
#[derive(Debug)]
pub enum NotEmbedded {
    /// No embedding model configured, or it is not loaded / reachable yet, or the breaker is
    /// open: keyword recall only.
    Unavailable,
    /// The model was called and failed.
    Failed(String),
}

/// Vector candidates less similar than the best one by more than this are dropped: entries
/// far behind the best meaning only add noise to the fusion (RRF is flat in rank).
const VECTOR_BAND: f32 = 0.12;

/// The distinct words of `words` (the query without stop words), case-folded.
fn distinct_words(words: &str) -> BTreeSet<String> {
    words
        .split(' ')
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect()
}

/// How many of the query's distinct words a keyword candidate must hold beside the vector
/// lane: more than half of them.
pub fn majority(words: &str) -> usize {
    majority_of(&distinct_words(words))
}

fn majority_of(wanted: &BTreeSet<String>) -> usize {
    wanted.len() / 2 + 1
}

/// The keyword lane's ids; with `strict`, only entries holding more than half of the distinct
/// words of `words` (the store's covering query already asks for that; this check also holds
/// past its combination limit).
fn keyword_band(hits: Vec<MemoryHit>, words: &str, strict: bool) -> Vec<i64> {
    let wanted = distinct_words(words);
    let need = majority_of(&wanted);
    hits.into_iter()
        .filter(|h| {
            !strict || {
                let have: std::collections::HashSet<String> = h
                    .content
                    .split(|c: char| !c.is_alphanumeric())
                    .filter(|w| !w.is_empty())
                    .map(str::to_lowercase)
                    .collect();
                wanted.iter().filter(|w| have.contains(*w)).count() >= need
            }
        })
        .map(|h| h.id)
        .collect()
}

/// What one recall asks of its keyword and vector lanes.
#[derive(Debug, Clone)]
pub struct LaneQuery<'a> {
    /// The entries of this tenant (of one agent when `agent` is Some).
    pub tenant_id: &'a str,
    pub agent: Option<&'a str>,
    /// The query's keywords ([`super::keyword_text`]).
    pub words: &'a str,
    /// Candidates per lane.
    pub candidates: usize,
    /// Matching entries the keyword lane ranks, the newest first.
    pub rank_window: usize,
    /// Vector candidates less similar than this are dropped.
    pub min_similarity: f32,
    /// A vector lane is expected: keyword candidates must hold most of the words.
    pub strict: bool,
}

/// The keyword and vector lanes of one recall, run concurrently: the full-text query goes to
/// the store's thread while this task embeds the query and scans the index.
///
/// With `strict`, the keyword lane asks only for entries holding most of the query's words,
/// which the index answers far faster than ranking every entry with any word; if the vector
/// lane then cannot run (`query_vector` yields None), the keyword lane runs again keeping every
/// match, as a keyword-only recall does.
pub async fn run_lanes(
    store: &Store,
    index: &RwLock<VectorIndex>,
    q: &LaneQuery<'_>,
    query_vector: impl Future<Output = Option<Arc<Vec<f32>>>>,
) -> Result<(Vec<MemoryHit>, Option<Vec<(i64, f32)>>), GatewayError> {
    let tenant = Tenant::owner(q.tenant_id);
    let need = if q.strict { majority(q.words) } else { 1 };
    let (k, window) = (q.candidates as i64, q.rank_window);
    let keyword = store.search_memories_covering(&tenant, q.agent, q.words, need, k, window);
    let vector = async {
        let v = query_vector.await?;
        let found = index
            .read()
            .map(|ix| ix.search(q.tenant_id, q.agent, &v, q.candidates, q.min_similarity));
        Some(found.unwrap_or_default())
    };
    let (keyword_hits, vector) = tokio::join!(keyword, vector);
    let keyword_hits = match (&vector, need) {
        (None, 2..) => {
            store
                .search_memories_covering(&tenant, q.agent, q.words, 1, k, window)
                .await?
        }
        _ => keyword_hits?,
    };
    Ok((keyword_hits, vector))
}

fn vector_band(hits: Vec<(i64, f32)>) -> Vec<i64> {
    let best = hits.first().map_or(0.0, |h| h.1);
    hits.into_iter()
        .filter(|(_, s)| *s >= best - VECTOR_BAND)
        .map(|(id, _)| id)
        .collect()
}

impl Memory {
    /// Whether the memory embedding model can be called now without waiting for it to load.
    pub fn embedder_ready(&self) -> bool {
        let Some(name) = self.state.model() else {
            return false;
        };
        let snap = self.calls.providers().snapshot();
        snap.model(name)
            .is_some_and(|m| self.calls.providers().available(&snap, m))
            && self.state.breaker_allows(now_ms())
    }

    /// Embeddings of `texts` by the memory model, in order: from the in-memory tier, then the
    /// persistent cache, then one model call for the rest (whose results fill both tiers).
    pub async fn embed_texts(&self, texts: &[String]) -> Result<Vec<Arc<Vec<f32>>>, NotEmbedded> {
        let Some(model) = self.state.model().map(str::to_owned) else {
            return Err(NotEmbedded::Unavailable);
        };
        let hashes: Vec<String> = texts.iter().map(|t| content_hash(t)).collect();
        let mut out: Vec<Option<Arc<Vec<f32>>>> = vec![None; texts.len()];
        let mut missing = Vec::new();
        for (i, h) in hashes.iter().enumerate() {
            if let Some(v) = self.state.l1_get(h) {
                out[i] = Some(v);
                continue;
            }
            match self.store.embedding_cache_get(h, &model).await {
                Ok(Some(v)) => {
                    self.state.l2_counters.hit(true);
                    let v = Arc::new(v);
                    self.state.l1_put(h.clone(), v.clone());
                    out[i] = Some(v);
                }
                Ok(None) => {
                    self.state.l2_counters.hit(false);
                    missing.push(i);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "embedding cache unreadable");
                    missing.push(i);
                }
            }
        }
        if !missing.is_empty() {
            let now = now_ms();
            if !self.state.breaker_allows(now) {
                return Err(NotEmbedded::Unavailable);
            }
            let inputs: Vec<String> = missing.iter().map(|i| texts[*i].clone()).collect();
            let made = self
                .calls
                .embed(&model, &inputs, &CancellationToken::new())
                .await;
            let vectors = match made {
                Ok((_, e)) if e.vectors.len() == inputs.len() => {
                    self.state.breaker_record(true, now);
                    e.vectors
                }
                Ok(_) => {
                    self.state.breaker_record(false, now);
                    return Err(NotEmbedded::Failed(
                        "the embedding model answered a different number of vectors".to_owned(),
                    ));
                }
                Err(EmbedError::NoEmbeddingProvider | EmbedError::ModelNotFound) => {
                    return Err(NotEmbedded::Unavailable)
                }
                Err(EmbedError::Failed(e)) => {
                    self.state.breaker_record(false, now);
                    return Err(NotEmbedded::Failed(e.to_string()));
                }
            };
            let mut cached = Vec::with_capacity(vectors.len());
            for (i, v) in missing.iter().zip(vectors) {
                let v = Arc::new(v);
                self.state.l1_put(hashes[*i].clone(), v.clone());
                cached.push((hashes[*i].clone(), (*v).clone()));
                out[*i] = Some(v);
            }
            if let Err(e) = self.store.embedding_cache_put(&model, &cached).await {
                tracing::warn!(error = %e, "embedding cache not written");
            }
        }
        Ok(out.into_iter().flatten().collect())
    }

    /// Recalls up to `limit` entries of `tenant_id` (of one agent when `at.agent` is Some)
    /// for `query`, best first, and records the recall (content-free).
    pub async fn recall(
        &self,
        tenant_id: &str,
        query: &str,
        limit: usize,
        at: RecallFor<'_>,
    ) -> Result<Recall, GatewayError> {
        let started = Instant::now();
        let tenant = Tenant::owner(tenant_id);
        let k = self.state.config.lane_candidates.max(limit);
        let words = keyword_text(query);
        // The vector lane runs only when the model answers now: a recall never waits for the
        // model to load (it is recorded as keyword-only instead).
        let ready = self.embedder_ready();
        let query_vector = async {
            if !ready {
                return None;
            }
            match self.embed_texts(&[query.to_owned()]).await {
                Ok(v) => v.into_iter().next(),
                Err(NotEmbedded::Failed(e)) => {
                    tracing::warn!(error = %e, "query not embedded; keyword recall only");
                    None
                }
                Err(NotEmbedded::Unavailable) => None,
            }
        };
        let lane_query = LaneQuery {
            tenant_id,
            agent: at.agent,
            words: &words,
            candidates: k,
            rank_window: self.state.config.keyword_rank_window,
            min_similarity: self.state.config.min_similarity,
            strict: ready,
        };
        let (keyword_hits, vector_hits) =
            run_lanes(&self.store, &self.state.index, &lane_query, query_vector).await?;
        let entity = self
            .store
            .memory_entity_ids(&tenant, at.agent, query, k as i64)
            .await?;
        let mut lanes = vec!["fts"];
        let mut vector = Vec::new();
        if let Some(found) = vector_hits {
            lanes.push("vector");
            vector = vector_band(found);
        }
        // Beside a vector lane, a keyword candidate must carry most of the query's words: one
        // incidental shared word is noise the meaning lane already judges better. Alone, the
        // keyword lane keeps every match.
        let fts = keyword_band(keyword_hits, &words, lanes.contains(&"vector"));
        if !entity.is_empty() {
            lanes.push("entity");
        }
        let candidates = {
            let mut all: Vec<i64> = fts.iter().chain(&vector).chain(&entity).copied().collect();
            all.sort_unstable();
            all.dedup();
            all.len()
        };
        let fused = fuse::rrf(&[&fts, &vector, &entity]);
        let chosen: Vec<(i64, f64)> = fused.into_iter().take(limit).collect();
        let ids: Vec<i64> = chosen.iter().map(|(id, _)| *id).collect();
        let rows = self.store.memory_rows(&tenant, &ids).await?;
        let hits: Vec<Hit> = rows
            .into_iter()
            .filter_map(|row| {
                let score = chosen.iter().find(|(id, _)| *id == row.id)?.1;
                Some(Hit {
                    row,
                    score: score.clamp(f64::MIN_POSITIVE, 1.0),
                })
            })
            .collect();
        let agent = at.agent.unwrap_or_default();
        self.state.count(tenant_id, agent, |c| {
            c.recalls += 1;
            c.with_hits += i64::from(!hits.is_empty());
            c.fts += 1;
            c.vector += i64::from(lanes.contains(&"vector"));
            c.entity += i64::from(lanes.contains(&"entity"));
        });
        let record = RecallRecord {
            ts: now_ms(),
            tenant_id: tenant_id.to_owned(),
            agent_id: agent.to_owned(),
            session_key: at.session_key.map(str::to_owned),
            trace_id: at.trace_id.map(str::to_owned),
            lanes: lanes.iter().map(|l| (*l).to_owned()).collect(),
            candidate_count: candidates as i64,
            final_count: hits.len() as i64,
            entry_ids: hits.iter().map(|h| h.row.id).collect(),
            duration_ms: started.elapsed().as_millis() as i64,
        };
        if let Err(e) = self.store.memory_recall_record(&record).await {
            tracing::warn!(error = %e, "recall not recorded");
        }
        Ok(Recall { hits, lanes })
    }
}
