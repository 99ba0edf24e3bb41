//! `memory`: the embedding model of the vector lane, the embedding queue and caches, recall
//! thresholds, consolidation of entities and observations, and how many entries a tenant may
//! keep.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::ConfigError;

/// By default at most this many matching entries, the newest first, are ranked by one memory
/// search (`memory.keywordRankWindow`): the cost of a search stays bounded however many entries share its words (a word in 40% of
/// 100,000 entries would otherwise rank 40,000 of them to keep 50). Entries past the window
/// are still found by the vector lane, and by a search with rarer words.
pub const MEMORY_RANK_WINDOW: usize = 5000;

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
    /// Recall records (`memory.recall_trace`) kept, in hours (at most ten years, so that the
    /// cut-off is always a real instant).
    #[schemars(range(min = 1, max = 87_600))]
    pub recall_retention_hours: u32,
    /// Entries one tenant may keep, over all its agents. A write that would pass it (a store,
    /// the agent's `memory_store` tool, an import counted whole) is refused with -32602; derived
    /// entities and observations do not count. It also bounds the tenant's share of the
    /// in-memory vector index.
    #[schemars(range(min = 1, max = 100_000_000))]
    pub max_entries_per_tenant: u64,
}

/// Default of `memory.maxEntriesPerTenant`: about 150 MB of 384-dimension vectors in the index.
pub const DEFAULT_MAX_ENTRIES_PER_TENANT: u64 = 100_000;
/// Largest `memory.maxEntriesPerTenant`.
pub const MAX_ENTRIES_PER_TENANT: u64 = 100_000_000;
/// Largest `memory.recallRetentionHours` (ten years).
pub const MAX_RECALL_RETENTION_HOURS: u32 = 87_600;

impl Default for MemoryConfig {
    fn default() -> Self {
        Self {
            embedding_model: format!("local/{}", super::engine::EMBED_MODEL_ID),
            embed_queue: 4096,
            embed_batch: 16,
            cache_entries: 10_000,
            min_similarity: 0.25,
            lane_candidates: 50,
            keyword_rank_window: MEMORY_RANK_WINDOW,
            consolidate_after: 20,
            recall_retention_hours: 168,
            max_entries_per_tenant: DEFAULT_MAX_ENTRIES_PER_TENANT,
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
    if !(1..=MAX_RECALL_RETENTION_HOURS).contains(&m.recall_retention_hours) {
        return bad("recallRetentionHours must be 1 to 87600");
    }
    if !(1..=MAX_ENTRIES_PER_TENANT).contains(&m.max_entries_per_tenant) {
        return bad("maxEntriesPerTenant must be 1 to 100000000");
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
        assert!(with(&|m| m.max_entries_per_tenant = 1).is_ok());
        assert!(with(&|m| m.max_entries_per_tenant = MAX_ENTRIES_PER_TENANT).is_ok());
        let past = with(&|m| m.max_entries_per_tenant = MAX_ENTRIES_PER_TENANT + 1).unwrap_err();
        assert!(past.0.contains("maxEntriesPerTenant"), "{past:?}");
        assert!(with(&|m| m.max_entries_per_tenant = 0).is_err());
        assert!(with(&|m| m.recall_retention_hours = MAX_RECALL_RETENTION_HOURS).is_ok());
        let long =
            with(&|m| m.recall_retention_hours = MAX_RECALL_RETENTION_HOURS + 1).unwrap_err();
        assert!(long.0.contains("recallRetentionHours"), "{long:?}");
        assert!(with(&|m| m.recall_retention_hours = 0).is_err());
    }

    #[test]
    fn the_schema_bounds_the_limit_and_the_retention() {
        let schema = serde_json::to_value(schemars::schema_for!(MemoryConfig)).unwrap();
        let props = &schema["properties"];
        let limit = &props["maxEntriesPerTenant"];
        assert_eq!(limit["minimum"], 1, "{limit}");
        assert_eq!(limit["maximum"], MAX_ENTRIES_PER_TENANT, "{limit}");
        assert_eq!(limit["default"], DEFAULT_MAX_ENTRIES_PER_TENANT, "{limit}");
        let hours = &props["recallRetentionHours"];
        assert_eq!(hours["maximum"], MAX_RECALL_RETENTION_HOURS, "{hours}");
        // Every duration of this section has a ceiling in the schema.
        for (name, p) in props.as_object().unwrap() {
            if ["Ms", "Seconds", "Hours"].iter().any(|u| name.ends_with(u)) {
                assert!(p.get("maximum").is_some(), "{name} has no maximum: {p}");
            }
        }
    }

    #[test]
    fn the_limit_is_camel_case_on_the_wire() {
        let m: MemoryConfig =
            serde_json::from_value(serde_json::json!({"maxEntriesPerTenant": 3})).unwrap();
        assert_eq!(m.max_entries_per_tenant, 3);
        assert_eq!(
            MemoryConfig::default().max_entries_per_tenant,
            DEFAULT_MAX_ENTRIES_PER_TENANT
        );
    }
}
