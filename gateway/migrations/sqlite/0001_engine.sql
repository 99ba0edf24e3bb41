-- Agents, providers, sessions with their transcripts, usage, background runs, agent memory
-- and session notes. Plain SQL that PostgreSQL also accepts, except the FTS5 tables and their
-- triggers (search is the one backend-specific part; see store/search.rs).

CREATE TABLE providers (
    id          TEXT PRIMARY KEY,
    kind        TEXT NOT NULL,
    config      TEXT NOT NULL,          -- JSON ProvidersConfig as stored (defaults filled in)
    seed_hash   TEXT,                   -- hash of the configuration-file entry it came from
    created_at  BIGINT NOT NULL,
    updated_at  BIGINT NOT NULL
);

CREATE TABLE agents (
    id          TEXT PRIMARY KEY,
    config      TEXT NOT NULL,          -- JSON AgentsConfig as stored (defaults filled in)
    suspended   INTEGER NOT NULL DEFAULT 0,
    seed_hash   TEXT,
    created_at  BIGINT NOT NULL,
    updated_at  BIGINT NOT NULL
);

CREATE TABLE sessions (
    session_key    TEXT PRIMARY KEY,
    agent_id       TEXT NOT NULL,
    channel        TEXT NOT NULL,
    tenant_id      TEXT,
    user_id        TEXT,
    label          TEXT,
    metadata       TEXT NOT NULL DEFAULT '{}',
    next_seq       BIGINT NOT NULL DEFAULT 0,
    input_tokens   BIGINT NOT NULL DEFAULT 0,
    output_tokens  BIGINT NOT NULL DEFAULT 0,
    cost_usd       DOUBLE PRECISION NOT NULL DEFAULT 0,
    last_steps     BIGINT NOT NULL DEFAULT 0,
    last_model     TEXT,
    created_at     BIGINT NOT NULL,
    updated_at     BIGINT NOT NULL
);
CREATE INDEX sessions_by_update ON sessions (updated_at);
CREATE INDEX sessions_by_tenant ON sessions (tenant_id, updated_at);

CREATE TABLE messages (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    session_key    TEXT NOT NULL REFERENCES sessions (session_key) ON DELETE CASCADE,
    seq            BIGINT NOT NULL,
    role           TEXT NOT NULL,
    content        TEXT NOT NULL,
    tool_calls     TEXT,                -- JSON array, assistant messages that call tools
    tool_call_id   TEXT,
    tool_name      TEXT,
    is_error       INTEGER,
    model          TEXT,
    input_tokens   BIGINT,
    output_tokens  BIGINT,
    created_at     BIGINT NOT NULL,
    UNIQUE (session_key, seq)
);

CREATE VIRTUAL TABLE messages_fts USING fts5 (content, content = 'messages', content_rowid = 'id');
CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts (rowid, content) VALUES (new.id, new.content);
END;
CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages BEGIN
    INSERT INTO messages_fts (messages_fts, rowid, content) VALUES ('delete', old.id, old.content);
END;

CREATE TABLE usage (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    ts             BIGINT NOT NULL,
    agent_id       TEXT NOT NULL,
    session_key    TEXT,
    provider       TEXT NOT NULL,
    model          TEXT NOT NULL,
    operation      TEXT NOT NULL,
    input_tokens   BIGINT NOT NULL,
    output_tokens  BIGINT NOT NULL,
    cached_tokens  BIGINT NOT NULL,
    cost_usd       DOUBLE PRECISION NOT NULL,
    latency_ms     BIGINT NOT NULL,
    ok             INTEGER NOT NULL,
    error_kind     TEXT
);
CREATE INDEX usage_by_time ON usage (ts);
CREATE INDEX usage_by_agent ON usage (agent_id, ts);

CREATE TABLE runs (
    run_id         TEXT PRIMARY KEY,
    root_run_id    TEXT NOT NULL,
    parent_run_id  TEXT,
    agent_id       TEXT NOT NULL,
    session_key    TEXT NOT NULL,
    task           TEXT NOT NULL,
    status         TEXT NOT NULL,
    depth          BIGINT NOT NULL,
    client_id      TEXT NOT NULL,
    started_at     BIGINT NOT NULL,
    completed_at   BIGINT,
    response       TEXT,
    input_tokens   BIGINT,
    output_tokens  BIGINT,
    cost_usd       DOUBLE PRECISION,
    finish_reason  TEXT,
    error          TEXT
);

CREATE TABLE memories (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    agent_id       TEXT NOT NULL,
    session_key    TEXT,
    content        TEXT NOT NULL,
    tags           TEXT NOT NULL DEFAULT '[]',
    created_at     BIGINT NOT NULL
);
CREATE INDEX memories_by_agent ON memories (agent_id);
CREATE INDEX memories_by_session ON memories (session_key);
CREATE VIRTUAL TABLE memories_fts USING fts5 (content, content = 'memories', content_rowid = 'id');
CREATE TRIGGER memories_fts_insert AFTER INSERT ON memories BEGIN
    INSERT INTO memories_fts (rowid, content) VALUES (new.id, new.content);
END;
CREATE TRIGGER memories_fts_delete AFTER DELETE ON memories BEGIN
    INSERT INTO memories_fts (memories_fts, rowid, content) VALUES ('delete', old.id, old.content);
END;

CREATE TABLE session_notes (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    session_key    TEXT NOT NULL REFERENCES sessions (session_key) ON DELETE CASCADE,
    note           TEXT NOT NULL,
    created_at     BIGINT NOT NULL
);
