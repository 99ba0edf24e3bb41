-- Memory and context (issue 18): typed, trust-levelled, pinnable memory entries with their
-- embeddings; entities and observations derived from them; content-free recall records; the
-- persistent embedding cache; and the summary tree of each stored conversation. Times are
-- epoch milliseconds; flags are 0/1. Embeddings are little-endian f32 arrays.

ALTER TABLE memories ADD COLUMN memory_type TEXT NOT NULL DEFAULT 'semantic';
ALTER TABLE memories ADD COLUMN trust_level TEXT NOT NULL DEFAULT 'learned';
ALTER TABLE memories ADD COLUMN pinned BIGINT NOT NULL DEFAULT 0;
ALTER TABLE memories ADD COLUMN updated_at BIGINT NOT NULL DEFAULT 0;
ALTER TABLE memories ADD COLUMN embedding BLOB;
ALTER TABLE memories ADD COLUMN embedding_model TEXT;
ALTER TABLE memories ADD COLUMN consolidated_at BIGINT;
UPDATE memories SET updated_at = created_at;
-- Entries stored before tenancy belong to the tenant of the conversation they were learned in.
UPDATE memories SET tenant_id =
    (SELECT s.tenant_id FROM sessions s WHERE s.session_key = memories.session_key)
WHERE tenant_id IS NULL;
CREATE INDEX memories_by_tenant_created ON memories (tenant_id, created_at);
CREATE INDEX memories_unembedded ON memories (id) WHERE embedding IS NULL;
CREATE INDEX memories_unconsolidated ON memories (tenant_id, agent_id) WHERE consolidated_at IS NULL;

-- People, places and things named in entries, per tenant and agent.
CREATE TABLE memory_entities (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant_id      TEXT NOT NULL,
    agent_id       TEXT NOT NULL,
    name           TEXT NOT NULL,
    norm           TEXT NOT NULL,      -- lowercased, whitespace-collapsed name: the identity
    first_seen     BIGINT NOT NULL,
    last_seen      BIGINT NOT NULL,
    UNIQUE (tenant_id, agent_id, norm)
);
CREATE TABLE memory_entity_mentions (
    entity_id      BIGINT NOT NULL REFERENCES memory_entities (id) ON DELETE CASCADE,
    memory_id      BIGINT NOT NULL REFERENCES memories (id) ON DELETE CASCADE,
    PRIMARY KEY (entity_id, memory_id)
);
CREATE INDEX memory_entity_mentions_by_memory ON memory_entity_mentions (memory_id);

-- Statements consolidated from several entries. A source keeps the session its entry was
-- learned in, so that session.reset_conversation purge_derived finds them after the entries
-- are gone.
CREATE TABLE memory_observations (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant_id       TEXT NOT NULL,
    agent_id        TEXT NOT NULL,
    content         TEXT NOT NULL,
    confidence      DOUBLE PRECISION NOT NULL,
    created_at      BIGINT NOT NULL,
    consolidated_at BIGINT NOT NULL
);
CREATE INDEX memory_observations_by_tenant ON memory_observations (tenant_id, agent_id, created_at);
CREATE TABLE memory_observation_sources (
    observation_id BIGINT NOT NULL REFERENCES memory_observations (id) ON DELETE CASCADE,
    memory_id      BIGINT NOT NULL,
    session_key    TEXT,
    PRIMARY KEY (observation_id, memory_id)
);
CREATE INDEX memory_observation_sources_by_memory ON memory_observation_sources (memory_id);
CREATE INDEX memory_observation_sources_by_session ON memory_observation_sources (session_key);

-- One row per recall: lanes, counts, chosen ids and timing; never the query or entry text.
CREATE TABLE memory_recalls (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    ts              BIGINT NOT NULL,
    tenant_id       TEXT NOT NULL,
    agent_id        TEXT NOT NULL,     -- '' for a tenant-wide search (memory.search, REST)
    session_key     TEXT,
    trace_id        TEXT,
    lanes           TEXT NOT NULL,     -- comma-separated: fts, vector
    candidate_count BIGINT NOT NULL,
    final_count     BIGINT NOT NULL,
    entry_ids       TEXT NOT NULL,     -- JSON array of entry ids, in order
    duration_ms     BIGINT NOT NULL
);
CREATE INDEX memory_recalls_by_tenant ON memory_recalls (tenant_id, ts);
CREATE INDEX memory_recalls_by_session ON memory_recalls (session_key, ts);
CREATE INDEX memory_recalls_by_trace ON memory_recalls (trace_id);

-- Embeddings by content, so that the same text is never embedded twice by the same model.
CREATE TABLE embedding_cache (
    content_hash   TEXT NOT NULL,      -- hex SHA-256 of the text
    model          TEXT NOT NULL,
    dims           BIGINT NOT NULL,
    vector         BLOB NOT NULL,
    created_at     BIGINT NOT NULL,
    PRIMARY KEY (content_hash, model)
);

-- The summary tree of a conversation: leaves summarise a range of its messages, condensed
-- nodes summarise consecutive nodes one level down. Messages are never deleted by it.
CREATE TABLE context_summaries (
    id             TEXT PRIMARY KEY,
    session_key    TEXT NOT NULL REFERENCES sessions (session_key) ON DELETE CASCADE,
    kind           TEXT NOT NULL,      -- leaf | condensed
    depth          BIGINT NOT NULL,
    content        TEXT NOT NULL,
    token_count    BIGINT NOT NULL,
    first_seq      BIGINT NOT NULL,    -- covered message range (inclusive)
    last_seq       BIGINT NOT NULL,
    message_count  BIGINT NOT NULL,    -- messages under the node
    taint          TEXT NOT NULL,      -- trusted | untrusted
    parent_id      TEXT,               -- the condensed node over it; NULL at the top
    created_at     BIGINT NOT NULL
);
CREATE INDEX context_summaries_by_session ON context_summaries (session_key, first_seq);
CREATE INDEX context_summaries_by_parent ON context_summaries (parent_id);
