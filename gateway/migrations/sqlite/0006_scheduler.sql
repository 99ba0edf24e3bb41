-- The scheduler (issue 15): cron jobs and their run log, and per-agent heartbeat state with the
-- wake coalescer and pending wake events. Times are epoch milliseconds; flags are 0/1.

CREATE TABLE cron_jobs (
    job_id        TEXT PRIMARY KEY,          -- job_<32 hex>
    owner         TEXT NOT NULL,             -- the creating client id; cron:config for file jobs
    name          TEXT NOT NULL,
    agent_id      TEXT NOT NULL,
    message       TEXT NOT NULL,
    kind          TEXT NOT NULL,             -- cron | interval | once
    schedule      TEXT NOT NULL,             -- JSON of the schedule as given
    anchor_at     BIGINT NOT NULL,           -- interval jobs fire at anchor_at + k * everyMs
    enabled       BIGINT NOT NULL DEFAULT 1,
    wake_gate     TEXT,                      -- JSON {script, args, timeoutSeconds}; file jobs only
    next_due_at   BIGINT,                    -- NULL: will not fire again
    fire_seq      BIGINT NOT NULL DEFAULT 0, -- bumped by every claim: fences the finish
    running_since BIGINT,                    -- a fire of this job runs (at most one)
    running_node  TEXT,
    last_run_at   BIGINT,
    last_status   TEXT,
    last_error    TEXT,
    seed_hash     TEXT,                      -- file jobs: the entry's hash when seeded
    created_at    BIGINT NOT NULL,
    updated_at    BIGINT NOT NULL,
    UNIQUE (owner, name)
);
CREATE INDEX cron_jobs_due ON cron_jobs (next_due_at) WHERE enabled = 1 AND running_since IS NULL;
CREATE INDEX cron_jobs_by_name ON cron_jobs (name);

CREATE TABLE cron_runs (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id          TEXT NOT NULL,           -- no foreign key: runs outlive their job
    owner           TEXT NOT NULL,
    job_name        TEXT NOT NULL,
    agent_id        TEXT NOT NULL,
    due_at          BIGINT NOT NULL,         -- the due time served (request time for force/due)
    ts              BIGINT NOT NULL,         -- start of the fire
    fire_trigger    TEXT NOT NULL,           -- schedule | catch_up | force | due
    status          TEXT NOT NULL,           -- running | ok | error | skipped
    duration_ms     BIGINT,
    summary         TEXT,
    error           TEXT,
    tool_calls      BIGINT,
    est_turns_saved BIGINT,
    root_run_id     TEXT,
    gate            TEXT,                    -- JSON {decision, durationMs, reason?}
    node            TEXT NOT NULL,
    UNIQUE (job_id, due_at)                  -- one record per due time, whatever happens
);
CREATE INDEX cron_runs_by_name ON cron_runs (owner, job_name, id);
CREATE INDEX cron_runs_by_job ON cron_runs (job_id, id);
CREATE INDEX cron_runs_by_time ON cron_runs (ts);
CREATE INDEX cron_runs_running ON cron_runs (status) WHERE status = 'running';

CREATE TABLE heartbeat_state (
    agent_id           TEXT PRIMARY KEY,
    next_due_at        BIGINT,               -- next scheduled tick; NULL: disabled or stopped
    wake_at            BIGINT,               -- the coalescer's one queued wake; NULL: none
    wake_sources       TEXT,                 -- JSON array: the source of the wake that queued the tick
    bypass_backoff     BIGINT NOT NULL DEFAULT 0, -- the queued wake is a heartbeat.trigger
    running_since      BIGINT,
    running_node       TEXT,
    tick_seq           BIGINT NOT NULL DEFAULT 0, -- bumped by every claim: fences the finish
    last_run_at        BIGINT,
    consecutive_errors BIGINT NOT NULL DEFAULT 0,
    backoff_until      BIGINT,
    last_alert_at      BIGINT,
    last_error_kind    TEXT,                 -- transient | permanent
    last_error         TEXT,
    updated_at         BIGINT NOT NULL
);

CREATE TABLE heartbeat_events (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    agent_id    TEXT NOT NULL,
    source      TEXT NOT NULL,
    text        TEXT NOT NULL,
    created_at  BIGINT NOT NULL
);
CREATE INDEX heartbeat_events_by_agent ON heartbeat_events (agent_id, id);
