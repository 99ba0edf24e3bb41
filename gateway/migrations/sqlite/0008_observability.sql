-- Observability (issue 17): the billing rollup, the session index (trace rows), diagnostic
-- events, system prompt reports and channel activity; the per-call cache figures and the
-- per-session turn counters the reports read. Times are epoch milliseconds; flags are 0/1.
-- Everything here is content-free: ids, names, counts, timings, codes and digests.

-- Cache figures per model call, priced when the call was made.
ALTER TABLE usage ADD COLUMN cache_write_tokens BIGINT NOT NULL DEFAULT 0;
ALTER TABLE usage ADD COLUMN cache_saved_usd DOUBLE PRECISION NOT NULL DEFAULT 0;
CREATE INDEX usage_by_session ON usage (session_key, ts);

-- Hourly sums of the usage rows, kept by the usage writer in the same transaction as the rows
-- (billing over millions of calls reads a few thousand of these). Successful calls only in the
-- token and cost sums; failed calls are counted apart.
CREATE TABLE usage_hourly (
    hour_ms            BIGINT NOT NULL,    -- start of the UTC hour
    agent_id           TEXT NOT NULL,
    provider           TEXT NOT NULL,
    model              TEXT NOT NULL,
    calls              BIGINT NOT NULL,    -- successful calls
    failed_calls       BIGINT NOT NULL,
    cache_hits         BIGINT NOT NULL,    -- successful calls that read from the prompt cache
    input_tokens       BIGINT NOT NULL,
    output_tokens      BIGINT NOT NULL,
    cached_tokens      BIGINT NOT NULL,
    cache_write_tokens BIGINT NOT NULL,
    cost_usd           DOUBLE PRECISION NOT NULL,
    cache_saved_usd    DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (hour_ms, agent_id, provider, model)
);
INSERT INTO usage_hourly (hour_ms, agent_id, provider, model, calls, failed_calls, cache_hits,
    input_tokens, output_tokens, cached_tokens, cache_write_tokens, cost_usd, cache_saved_usd)
SELECT (ts / 3600000) * 3600000, agent_id, provider, model,
    SUM(CASE WHEN ok = 1 THEN 1 ELSE 0 END), SUM(CASE WHEN ok = 1 THEN 0 ELSE 1 END),
    SUM(CASE WHEN ok = 1 AND cached_tokens > 0 THEN 1 ELSE 0 END),
    SUM(CASE WHEN ok = 1 THEN input_tokens ELSE 0 END), SUM(CASE WHEN ok = 1 THEN output_tokens ELSE 0 END),
    SUM(CASE WHEN ok = 1 THEN cached_tokens ELSE 0 END), 0,
    SUM(CASE WHEN ok = 1 THEN cost_usd ELSE 0 END), 0
FROM usage GROUP BY (ts / 3600000) * 3600000, agent_id, provider, model;

-- How each session's last turn ended, and how many turns it ran (obs.explain, fleet health).
ALTER TABLE sessions ADD COLUMN turns BIGINT NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN last_finish_reason TEXT;
ALTER TABLE sessions ADD COLUMN last_error_kind TEXT;

-- The session index: one row per inbound message, tool result, outbound message and turn end
-- (an ephemeral turn: its turn end only). Swept after observability.traceRetentionHours.
CREATE TABLE trace_rows (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    ts             BIGINT NOT NULL,
    seq            BIGINT NOT NULL,        -- the transcript position (ephemeral turns: the step)
    kind           TEXT NOT NULL,          -- inbound | outbound | tool_result | turn_end | error
    session_key    TEXT NOT NULL,
    tenant_id      TEXT,                   -- the session's owner (obs.diagnostics-style filtering)
    chat_id        TEXT,
    message_id     TEXT,
    trace_id       TEXT NOT NULL,
    agent_id       TEXT,
    channel        TEXT,
    tool_name      TEXT,
    status         TEXT,                   -- ok | error | skipped
    duration_ms    BIGINT,
    tokens         BIGINT,
    cost_usd       DOUBLE PRECISION,
    synthetic      BIGINT NOT NULL DEFAULT 0,
    finish_reason  TEXT,
    error_kind     TEXT,
    result_digest  TEXT,
    result_bytes   BIGINT,
    detail         TEXT,                   -- JSON, content-free (turn ends: the context budget)
    fallback       BIGINT NOT NULL DEFAULT 0   -- turn ends answered by a fallback model
);
CREATE INDEX trace_by_time ON trace_rows (ts);
CREATE INDEX trace_by_session ON trace_rows (session_key, seq);
CREATE INDEX trace_by_trace ON trace_rows (trace_id);
CREATE INDEX trace_by_chat ON trace_rows (chat_id, ts) WHERE chat_id IS NOT NULL;
CREATE INDEX trace_by_message ON trace_rows (message_id) WHERE message_id IS NOT NULL;

-- Diagnostic events (obs.diagnostics), content-free; swept after
-- observability.diagnosticsRetentionHours.
CREATE TABLE diagnostics (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    ts           BIGINT NOT NULL,
    category     TEXT NOT NULL,            -- usage | webhook | message | session
    type         TEXT NOT NULL,
    tenant_id    TEXT,                     -- the owner of the session involved; NULL: operator only
    agent_id     TEXT,
    session_key  TEXT,
    channel_id   TEXT,
    data         TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX diagnostics_by_time ON diagnostics (ts);
CREATE INDEX diagnostics_by_tenant ON diagnostics (tenant_id, ts);
CREATE INDEX diagnostics_by_session ON diagnostics (session_key, ts) WHERE session_key IS NOT NULL;

-- How system prompts were assembled (sizes only); the newest few per session are kept.
CREATE TABLE prompt_reports (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    session_key  TEXT NOT NULL,
    agent_id     TEXT NOT NULL,
    run_id       TEXT,
    created_at   BIGINT NOT NULL,
    report       TEXT NOT NULL             -- JSON ObsSystemPromptReport
);
CREATE INDEX prompt_reports_by_session ON prompt_reports (session_key, id);

-- Messages in and out per channel of the gateway (api, v1, webhook:<mapping>, cron, heartbeat).
CREATE TABLE channel_activity (
    channel_id         TEXT PRIMARY KEY,
    channel_type       TEXT NOT NULL,
    last_active_at     BIGINT NOT NULL,
    messages_sent      BIGINT NOT NULL,
    messages_received  BIGINT NOT NULL
);
