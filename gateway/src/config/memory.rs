//! `memory`: the embedding model of the vector lane, the embedding queue and caches, recall
//! thresholds and consolidation of entities and observations.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::ConfigError;

/// `memory`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct MemoryConfig {
    /// The model (`<provider>/<modelId>`) that embeds entries and queries for the vector lane:
    /// one model for the whole gateway, so that every stored vector is comparable. Empty turns
    /// the vector lane off (keyword recall only).
    pub embedding_model: String,
    /// Entries waiting for their embedding, at most. Storing never waits: beyond this the entry
    /// is embedded by the next sweep of unembedded entries.
    pub embed_queue: usize,
    /// Entries embedded per model call.
    pub embed_batch: usize,
    /// Embeddings kept in memory (least recently used dropped) over the persistent cache.
    pub cache_entries: usize,
    /// Vector-lane candidates less similar than this (cosine) are not recalled.
    pub min_similarity: f32,
    /// Candidates each lane contributes before fusion.
    pub lane_candidates: usize,
    /// Matching entries the keyword lane ranks per recall, the newest first: its cost stays
    /// bounded however many entries share the query's words (the vector lane still reaches
    /// every entry).
    pub keyword_rank_window: usize,
    /// Unconsolidated entries of one agent that start a consolidation into entities and
    /// observations (through the agent's `memory` operation model); 0 turns it off.
    pub consolidate_after: u32,
    /// Recall records (`memory.recall_trace`) kept, in hours.
    pub recall_retention_hours: u32,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        Self {
            embedding_model: format!("local/{}", crate::runtime::providers::local::EMBED_MODEL_ID),
            embed_queue: 4096,
            embed_batch: 16,
            cache_entries: 10_000,
            min_similarity: 0.25,
            lane_candidates: 50,
            keyword_rank_window: crate::store::search::MEMORY_RANK_WINDOW,
            consolidate_after: 20,
            recall_retention_hours: 168,
        }
    }
}

/// Checks the ranges of `memory`.
pub fn validate(m: &MemoryConfig) -> Result<(), ConfigError> {
    let bad = |what: &str| Err(ConfigError(format!("memory.{what}")));
    if !(1..=1_000_000).contains(&m.embed_queue) {
        return bad("embedQueue must be 1 to 1000000");
    }
    if !(1..=256).contains(&m.embed_batch) {
        return bad("embedBatch must be 1 to 256");
    }
    if m.cache_entries > 10_000_000 {
        return bad("cacheEntries must be at most 10000000");
    }
    if !(-1.0..=1.0).contains(&m.min_similarity) {
        return bad("minSimilarity must be -1 to 1");
    }
    if !(1..=1000).contains(&m.lane_candidates) {
        return bad("laneCandidates must be 1 to 1000");
    }
    if !(m.lane_candidates..=10_000_000).contains(&m.keyword_rank_window) {
        return bad("keywordRankWindow must be laneCandidates to 10000000");
    }
    if m.recall_retention_hours == 0 {
        return bad("recallRetentionHours must be at least 1");
    }
    if !m.embedding_model.is_empty() && !m.embedding_model.contains('/') {
        return bad(
            "embeddingModel must be <provider>/<modelId> (or empty to turn the vector lane off)",
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_hold_at_the_bound_and_fail_past_it() {
        let with = |f: &dyn Fn(&mut MemoryConfig)| {
            let mut m = MemoryConfig::default();
            f(&mut m);
            validate(&m)
        };
        assert!(with(&|_| {}).is_ok());
        assert!(with(&|m| m.lane_candidates = 1000).is_ok());
        assert!(with(&|m| m.lane_candidates = 1001).is_err());
        assert!(with(&|m| m.lane_candidates = 0).is_err());
        assert!(with(&|m| m.keyword_rank_window = 10_000_000).is_ok());
        assert!(with(&|m| m.keyword_rank_window = 10_000_001).is_err());
        assert!(
            with(&|m| m.keyword_rank_window = 50).is_ok(),
            "= laneCandidates"
        );
        let short = with(&|m| m.keyword_rank_window = 49).unwrap_err();
        assert!(short.0.contains("keywordRankWindow"), "{short:?}");
    }
}
