//! `memory.*`: long-term memory per tenant - search, management, portability, recall reports.
//! Every method works in one tenant: the one its tenantId/tenant_id names (the
//! `memory_tenant` ownership rule has refused another tenant's name to a caller without
//! admin) or the caller's own.

use std::collections::BTreeMap;

use super::Rpc;
use crate::api::error::GatewayError;
use crate::api::generated::handlers::MemoryApi;
use crate::api::generated::types::*;
use crate::api::tenancy::Tenant;
use crate::api::CallContext;
use crate::clock::now_ms;
use crate::runtime::memory::consolidate::Answer;
use crate::runtime::memory::portable::{self, Plan};
use crate::runtime::memory::recall::{Hit, RecallFor};
use crate::runtime::memory::write::Source;
use crate::store::memory::{MemoryCounts, MemoryFilter, MemoryRow, NewMemory, RecallQuery};

/// Characters of content in browse pages and search_files results.
const PREVIEW: usize = 500;

fn entry(r: MemoryRow, max_chars: Option<usize>) -> MemoryEntry {
    MemoryEntry {
        id: r.id.to_string(),
        content: match max_chars {
            Some(n) => crate::runtime::memory::preview(&r.content, n),
            None => r.content,
        },
        tags: r.tags,
        memory_type: MemoryEntryType::from_wire(&r.memory_type)
            .unwrap_or(MemoryEntryType::Semantic),
        trust_level: MemoryTrustLevel::from_wire(&r.trust_level)
            .unwrap_or(MemoryTrustLevel::External),
        agent_id: r.agent_id,
        tenant_id: r.tenant_id,
        source_session_key: r.session_key,
        pinned: r.pinned,
        created_at: r.created_at,
    }
}

fn hit(h: Hit) -> MemorySearchHit {
    let e = entry(h.row, None);
    MemorySearchHit {
        id: e.id,
        content: e.content,
        tags: e.tags,
        memory_type: e.memory_type,
        trust_level: e.trust_level,
        agent_id: e.agent_id,
        source_session_key: e.source_session_key,
        pinned: e.pinned,
        created_at: e.created_at,
        score: h.score,
    }
}

/// An entry id as the store knows it; an id that is not one of ours is simply not found.
fn entry_id(id: &str) -> Result<i64, GatewayError> {
    id.parse::<i64>()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| not_found(id))
}

fn not_found(id: &str) -> GatewayError {
    let shown: String = id.chars().take(200).filter(|c| !c.is_control()).collect();
    GatewayError::not_found("Memory entry", shown)
}

fn map(pairs: Vec<(String, i64)>) -> BTreeMap<String, i64> {
    pairs.into_iter().collect()
}

/// The statistics of a tenant's memory (shared by memory.stats, memory.inspect and REST).
pub(crate) async fn stats(
    engine: &crate::runtime::engine::Engine,
    tenant: &Tenant,
    tenant_id: &str,
    agent: Option<&str>,
) -> Result<MemoryStats, GatewayError> {
    let c: MemoryCounts = engine.store.memory_counts(tenant, agent).await?;
    let vector_indexed = engine.memory.state.model().is_some()
        && engine
            .memory
            .state
            .index_loaded
            .load(std::sync::atomic::Ordering::Relaxed);
    Ok(MemoryStats {
        tenant_id: tenant_id.to_owned(),
        agent_id: agent.map(str::to_owned),
        total_entries: c.total,
        pinned_entries: c.pinned,
        embedded_entries: c.embedded,
        by_type: map(c.by_type),
        by_trust_level: map(c.by_trust),
        by_agent: map(c.by_agent),
        total_sessions: c.sessions,
        observations: c.observations,
        entities: c.entities,
        fts_indexed: true,
        vector_indexed,
        db_size_bytes: engine.store.size_bytes().await.unwrap_or(0),
        oldest_created_at: c.oldest,
        newest_created_at: c.newest,
    })
}

/// Tenant-wide hybrid search (memory.search and GET /api/memory/search).
pub(crate) async fn search(
    engine: &crate::runtime::engine::Engine,
    tenant_id: &str,
    query: &str,
    limit: usize,
) -> Result<Vec<MemorySearchHit>, GatewayError> {
    let recall = engine
        .memory
        .recall(tenant_id, query, limit, RecallFor::default())
        .await?;
    Ok(recall.hits.into_iter().map(hit).collect())
}

impl MemoryApi for Rpc {
    async fn ask(
        &self,
        ctx: &CallContext,
        p: MemoryAskParams,
    ) -> Result<MemoryAskResult, GatewayError> {
        let (_, tenant_id) = ctx.tenant_named(None);
        let Answer {
            answer,
            citations,
            abstained,
        } = self
            .engine()
            .memory
            .ask(&tenant_id, &p.question, p.limit as usize)
            .await?;
        Ok(MemoryAskResult {
            answer,
            citations: citations.iter().map(i64::to_string).collect(),
            abstained,
        })
    }

    async fn browse(
        &self,
        ctx: &CallContext,
        p: MemoryBrowseParams,
    ) -> Result<MemoryBrowseResult, GatewayError> {
        let (tenant, _) = ctx.tenant_named(p.tenant_id.as_deref());
        let memory_type = p.memory_type.map(MemoryEntryType::as_str);
        let trust_level = p.trust_level.map(MemoryTrustLevel::as_str);
        let tags = p.tags.unwrap_or_default();
        let filter = MemoryFilter {
            agent_id: p.agent_id.as_deref(),
            memory_type,
            trust_level,
            tags: &tags,
            oldest_first: matches!(p.sort, MemoryBrowseParamsSort::Oldest),
        };
        let (rows, total) = self
            .engine()
            .store
            .memory_page(&tenant, &filter, p.offset, p.limit)
            .await?;
        let has_more = p.offset + (rows.len() as i64) < total;
        Ok(MemoryBrowseResult {
            entries: rows.into_iter().map(|r| entry(r, Some(PREVIEW))).collect(),
            total,
            offset: p.offset,
            limit: p.limit,
            has_more,
        })
    }

    async fn delete(
        &self,
        ctx: &CallContext,
        p: MemoryDeleteParams,
    ) -> Result<MemoryDeleteResult, GatewayError> {
        let (tenant, _) = ctx.tenant_named(p.tenant_id.as_deref());
        let ids: Vec<i64> = p.ids.iter().filter_map(|i| entry_id(i).ok()).collect();
        let deleted = self.engine().store.memory_delete_ids(&tenant, &ids).await?;
        self.engine().memory.state.unindex(&deleted);
        let total = p.ids.len() as i64;
        Ok(MemoryDeleteResult {
            deleted: deleted.len() as i64,
            failed: total - deleted.len() as i64,
            total,
        })
    }

    async fn embedding_cache(
        &self,
        _ctx: &CallContext,
        _p: MemoryEmbeddingCacheParams,
    ) -> Result<MemoryEmbeddingCacheResult, GatewayError> {
        let engine = self.engine();
        let m = &engine.memory.state;
        let (entries, max_entries) = m.l1_size();
        let load =
            |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed) as i64;
        let (hits, misses) = (load(&m.l1_counters.hits), load(&m.l1_counters.misses));
        let (l2_entries, l2_bytes) = engine.store.embedding_cache_size().await?;
        let (state, failures, opened_at) = m.breaker_state(now_ms());
        let enabled = m.config.cache_entries > 0;
        Ok(MemoryEmbeddingCacheResult {
            enabled,
            provider: m.model().map(str::to_owned),
            vec_available: engine.memory.embedder_ready(),
            l1: enabled.then(|| MemoryEmbeddingCacheResultL1 {
                entries: entries as i64,
                max_entries: max_entries as i64,
                hits,
                misses,
                hit_rate: if hits + misses == 0 {
                    0.0
                } else {
                    hits as f64 / (hits + misses) as f64
                },
            }),
            l2: enabled.then(|| MemoryEmbeddingCacheResultL2 {
                entries: l2_entries,
                size_bytes: l2_bytes,
                hits: load(&m.l2_counters.hits),
                misses: load(&m.l2_counters.misses),
            }),
            circuit_breaker: MemoryEmbeddingCacheResultCircuitBreaker {
                state: match state {
                    crate::runtime::memory::BreakerState::Closed => {
                        MemoryEmbeddingCacheResultCircuitBreakerState::Closed
                    }
                    crate::runtime::memory::BreakerState::Open => {
                        MemoryEmbeddingCacheResultCircuitBreakerState::Open
                    }
                    crate::runtime::memory::BreakerState::HalfOpen => {
                        MemoryEmbeddingCacheResultCircuitBreakerState::HalfOpen
                    }
                },
                consecutive_failures: failures as i64,
                opened_at,
            },
        })
    }

    async fn entities(
        &self,
        ctx: &CallContext,
        p: MemoryEntitiesParams,
    ) -> Result<MemoryEntitiesResult, GatewayError> {
        let (tenant, _) = ctx.tenant_named(p.tenant_id.as_deref());
        let rows = self
            .engine()
            .store
            .memory_entities(&tenant, p.agent_id.as_deref(), p.limit)
            .await?;
        Ok(MemoryEntitiesResult {
            entities: rows
                .into_iter()
                .map(|e| MemoryEntitiesResultEntitiesItem {
                    id: e.id.to_string(),
                    name: e.name,
                    mention_count: e.mentions,
                    first_seen: Some(e.first_seen),
                    last_seen: Some(e.last_seen),
                })
                .collect(),
        })
    }

    async fn export(
        &self,
        ctx: &CallContext,
        p: MemoryExportParams,
    ) -> Result<MemoryExportResult, GatewayError> {
        let (tenant, _) = ctx.tenant_named(p.tenant_id.as_deref());
        let filter = MemoryFilter {
            agent_id: p.agent_id.as_deref(),
            ..MemoryFilter::default()
        };
        let (rows, total) = self
            .engine()
            .store
            .memory_page(&tenant, &filter, p.offset, p.limit)
            .await?;
        let has_more = p.offset + (rows.len() as i64) < total;
        Ok(MemoryExportResult {
            entries: rows.into_iter().map(|r| entry(r, None)).collect(),
            total,
            offset: p.offset,
            limit: p.limit,
            has_more,
        })
    }

    async fn flush(
        &self,
        ctx: &CallContext,
        p: MemoryFlushParams,
    ) -> Result<MemoryFlushResult, GatewayError> {
        let (tenant, tenant_id) = ctx.tenant_named(p.tenant_id.as_deref());
        let engine = self.engine();
        let removed = engine
            .store
            .memory_flush(&tenant, p.agent_id.as_deref())
            .await?;
        if let Ok(mut ix) = engine.memory.state.index.write() {
            ix.remove_scope(&tenant_id, p.agent_id.as_deref());
        }
        Ok(MemoryFlushResult {
            flushed: true,
            entries_removed: removed,
            scope: MemoryFlushResultScope {
                tenant_id,
                agent_id: p.agent_id,
            },
        })
    }

    async fn get_file(
        &self,
        _ctx: &CallContext,
        p: MemoryGetFileParams,
    ) -> Result<MemoryGetFileResult, GatewayError> {
        let engine = self.engine();
        let agent = engine.agents.require_or_default(p.agent_id.as_deref())?;
        // The agent's memory files only (MEMORY.md, memory/**): operator content shared by
        // every tenant of the agent, so no tenant rule applies (memory/files.rs judges the path).
        let root = crate::runtime::agents::workspace_dir(&engine.data_dir, &agent.id);
        let text = crate::runtime::memory::files::read(&root, &p.path).await?;
        let lines: Vec<&str> = text.lines().collect();
        let total = lines.len() as i64;
        let end = p.end_line.unwrap_or(total).min(total);
        if let Some(e) = p.end_line {
            if e < p.start_line {
                return Err(GatewayError::InvalidParams(
                    "'endLine': must not be before startLine".into(),
                ));
            }
        }
        let from = (p.start_line - 1).max(0) as usize;
        let content = if (from as i64) < end {
            lines[from..end as usize].join("\n")
        } else {
            String::new()
        };
        Ok(MemoryGetFileResult {
            path: p.path,
            start_line: p.start_line,
            end_line: end.max(0),
            total_lines: total,
            content,
        })
    }

    async fn inspect(
        &self,
        ctx: &CallContext,
        p: MemoryInspectParams,
    ) -> Result<MemoryInspectResult, GatewayError> {
        let (tenant, tenant_id) = ctx.tenant_named(p.tenant_id.as_deref());
        match p.id {
            Some(id) => {
                let row = self
                    .engine()
                    .store
                    .memory_get(&tenant, entry_id(&id)?)
                    .await?
                    .ok_or_else(|| not_found(&id))?;
                Ok(MemoryInspectResult {
                    entry: Some(entry(row, None)),
                    stats: None,
                })
            }
            None => Ok(MemoryInspectResult {
                entry: None,
                stats: Some(stats(self.engine(), &tenant, &tenant_id, None).await?),
            }),
        }
    }

    async fn observations(
        &self,
        ctx: &CallContext,
        p: MemoryObservationsParams,
    ) -> Result<MemoryObservationsResult, GatewayError> {
        let (tenant, _) = ctx.tenant_named(p.tenant_id.as_deref());
        let rows = self
            .engine()
            .store
            .memory_observations(&tenant, p.agent_id.as_deref(), p.limit)
            .await?;
        Ok(MemoryObservationsResult {
            observations: rows
                .into_iter()
                .map(|o| MemoryObservationsResultObservationsItem {
                    id: o.id.to_string(),
                    content: o.content,
                    proof_count: Some(o.sources.len() as i64),
                    source_ids: Some(o.sources.iter().map(i64::to_string).collect()),
                    confidence: Some(o.confidence),
                    consolidated_at: Some(o.consolidated_at),
                    created_at: o.created_at,
                })
                .collect(),
        })
    }

    async fn pin(
        &self,
        ctx: &CallContext,
        p: MemoryPinParams,
    ) -> Result<MemoryPinResult, GatewayError> {
        let changed = self
            .set_pinned(
                ctx,
                &p.id,
                p.tenant_id.as_deref(),
                p.agent_id.as_deref(),
                true,
            )
            .await?;
        Ok(MemoryPinResult {
            id: p.id,
            pinned: true,
            changed,
        })
    }

    async fn portability_export(
        &self,
        ctx: &CallContext,
        p: MemoryPortabilityExportParams,
    ) -> Result<MemoryPortabilityExportResult, GatewayError> {
        let (tenant, tenant_id) = ctx.tenant_named(p.tenant_id.as_deref());
        let filter = MemoryFilter {
            agent_id: p.agent_id.as_deref(),
            ..MemoryFilter::default()
        };
        let (rows, _) = self
            .engine()
            .store
            .memory_page(&tenant, &filter, 0, p.limit)
            .await?;
        let entries: Vec<MemoryPortableEntry> = rows
            .into_iter()
            .map(|r| {
                let e = entry(r, None);
                MemoryPortableEntry {
                    id: Some(e.id),
                    content: e.content,
                    tags: Some(e.tags),
                    memory_type: Some(e.memory_type),
                    trust_level: Some(e.trust_level),
                    pinned: Some(e.pinned),
                    created_at: Some(e.created_at),
                }
            })
            .collect();
        Ok(MemoryPortabilityExportResult {
            schema_version: MemoryPortabilityExportResultSchemaVersion::AgentGatewayMemoryExportV1,
            exported_at: now_ms(),
            scope: MemoryPortabilityExportResultScope {
                tenant_id,
                agent_id: p.agent_id,
            },
            entry_count: entries.len() as i64,
            entries,
        })
    }

    async fn portability_import(
        &self,
        ctx: &CallContext,
        p: MemoryPortabilityImportParams,
    ) -> Result<MemoryPortabilityImportResult, GatewayError> {
        let (_, tenant_id) = ctx.tenant_named(p.tenant_id.as_deref());
        let engine = self.engine();
        let now = now_ms();
        let mut plans = Vec::with_capacity(p.entries.len());
        let (mut blocked, mut downgraded) = (0i64, 0i64);
        for e in &p.entries {
            let trust = e.trust_level.map(MemoryTrustLevel::as_str);
            let tags = e.tags.clone().unwrap_or_default();
            match portable::plan(&e.content, trust, &tags) {
                Plan::Blocked => blocked += 1,
                Plan::Store {
                    checked,
                    downgraded: d,
                } => {
                    downgraded += i64::from(d);
                    plans.push((e, checked));
                }
            }
        }
        let imported = plans.len() as i64;
        if p.dry_run {
            // A dry run predicts the real one, the per-tenant limit included.
            engine.memory.check_room(&tenant_id, plans.len()).await?;
        } else if !plans.is_empty() {
            let news: Vec<NewMemory<'_>> = plans
                .iter()
                .map(|(e, c)| NewMemory {
                    agent_id: &p.agent_id,
                    session_key: None,
                    content: &e.content,
                    tags: &c.tags,
                    memory_type: e.memory_type.map_or("semantic", MemoryEntryType::as_str),
                    trust_level: c.trust_level,
                    pinned: e.pinned.unwrap_or(false),
                    created_at: e.created_at.unwrap_or(now),
                })
                .collect();
            let ids = engine.memory.insert_checked(&tenant_id, &news).await?;
            let checked: Vec<&crate::runtime::memory::write::Checked> =
                plans.iter().map(|(_, c)| c).collect();
            engine
                .memory
                .written(&tenant_id, &p.agent_id, &ids, Source::Import, &checked);
        }
        Ok(MemoryPortabilityImportResult {
            imported,
            blocked,
            downgraded,
            total: p.entries.len() as i64,
            dry_run: p.dry_run,
        })
    }

    async fn recall_stats(
        &self,
        ctx: &CallContext,
        p: MemoryRecallStatsParams,
    ) -> Result<MemoryRecallStatsResult, GatewayError> {
        let (_, tenant_id) = ctx.tenant_named(p.tenant_id.as_deref());
        let c = self
            .engine()
            .memory
            .state
            .counters(&tenant_id, p.agent_id.as_deref());
        Ok(MemoryRecallStatsResult {
            lane_usage: MemoryRecallStatsResultLaneUsage {
                fts: c.fts,
                vector: c.vector,
                entity: c.entity,
            },
            recalls: c.recalls,
            recalls_with_hits: c.with_hits,
            recall_hit_rate: if c.recalls == 0 {
                0.0
            } else {
                c.with_hits as f64 / c.recalls as f64
            },
            rerank_runs: 0,
            rerank_fallbacks: 0,
            rerank_fallback_rate: 0.0,
            consolidation_clusters: c.clusters,
            observations_created: c.observations,
        })
    }

    async fn recall_trace(
        &self,
        ctx: &CallContext,
        p: MemoryRecallTraceParams,
    ) -> Result<MemoryRecallTraceResult, GatewayError> {
        let (tenant, _) = ctx.tenant_named(p.tenant_id.as_deref());
        let rows = self
            .engine()
            .store
            .memory_recalls(
                &tenant,
                &RecallQuery {
                    agent_id: p.agent_id.as_deref(),
                    session_key: p.session_key.as_deref(),
                    trace_id: p.trace_id.as_deref(),
                    limit: p.limit,
                },
            )
            .await?;
        Ok(MemoryRecallTraceResult {
            records: rows
                .into_iter()
                .map(|r| MemoryRecallTraceResultRecordsItem {
                    ts: r.ts,
                    agent_id: r.agent_id,
                    session_key: r.session_key,
                    trace_id: r.trace_id,
                    lanes: r.lanes,
                    candidate_count: r.candidate_count,
                    final_count: r.final_count,
                    reranked: false,
                    rerank_fallback: false,
                    entry_ids: r.entry_ids.iter().map(i64::to_string).collect(),
                    duration_ms: r.duration_ms,
                })
                .collect(),
        })
    }

    async fn search(
        &self,
        ctx: &CallContext,
        p: MemorySearchParams,
    ) -> Result<MemorySearchResult, GatewayError> {
        let (_, tenant_id) = ctx.tenant_named(p.tenant_id.as_deref());
        Ok(MemorySearchResult {
            results: search(self.engine(), &tenant_id, &p.query, p.limit as usize).await?,
        })
    }

    async fn search_files(
        &self,
        ctx: &CallContext,
        p: MemorySearchFilesParams,
    ) -> Result<MemorySearchFilesResult, GatewayError> {
        let (_, tenant_id) = ctx.tenant_named(None);
        let engine = self.engine();
        let agent = engine.agents.require_or_default(p.agent_id.as_deref())?;
        let recall = engine
            .memory
            .recall(
                &tenant_id,
                &p.query,
                p.limit as usize,
                RecallFor {
                    agent: Some(&agent.id),
                    ..RecallFor::default()
                },
            )
            .await?;
        Ok(MemorySearchFilesResult {
            results: recall
                .hits
                .into_iter()
                .map(|h| MemorySearchFilesResultResultsItem {
                    id: h.row.id.to_string(),
                    content: crate::runtime::memory::preview(&h.row.content, PREVIEW),
                    score: h.score,
                    tags: h.row.tags,
                    created_at: h.row.created_at,
                })
                .collect(),
        })
    }

    async fn stats(
        &self,
        ctx: &CallContext,
        p: MemoryStatsParams,
    ) -> Result<MemoryStats, GatewayError> {
        let (tenant, tenant_id) = ctx.tenant_named(p.tenant_id.as_deref());
        stats(self.engine(), &tenant, &tenant_id, p.agent_id.as_deref()).await
    }

    async fn store(
        &self,
        ctx: &CallContext,
        p: MemoryStoreParams,
    ) -> Result<MemoryStoreResult, GatewayError> {
        let (_, tenant_id) = ctx.tenant_named(None);
        let engine = self.engine();
        let agent = engine.agents.require_or_default(p.agent_id.as_deref())?;
        let tags = p.tags.unwrap_or_default();
        let trust = p.trust_level.as_str();
        let (id, _) = engine
            .memory
            .write(
                &tenant_id,
                NewMemory {
                    agent_id: &agent.id,
                    session_key: None,
                    content: &p.content,
                    tags: &tags,
                    memory_type: "semantic",
                    trust_level: trust,
                    pinned: false,
                    created_at: now_ms(),
                },
                Source::Operator,
            )
            .await?;
        Ok(MemoryStoreResult {
            stored: true,
            id: id.to_string(),
        })
    }

    async fn unpin(
        &self,
        ctx: &CallContext,
        p: MemoryUnpinParams,
    ) -> Result<MemoryUnpinResult, GatewayError> {
        let changed = self
            .set_pinned(
                ctx,
                &p.id,
                p.tenant_id.as_deref(),
                p.agent_id.as_deref(),
                false,
            )
            .await?;
        Ok(MemoryUnpinResult {
            id: p.id,
            unpinned: true,
            changed,
        })
    }
}

impl Rpc {
    /// memory.pin / memory.unpin: whether the entry changed; -32001 when there is none.
    async fn set_pinned(
        &self,
        ctx: &CallContext,
        id: &str,
        tenant: Option<&str>,
        agent: Option<&str>,
        pinned: bool,
    ) -> Result<bool, GatewayError> {
        let (tenant, _) = ctx.tenant_named(tenant);
        self.engine()
            .store
            .memory_set_pinned(&tenant, entry_id(id)?, agent, pinned)
            .await?
            .ok_or_else(|| not_found(id))
    }
}
