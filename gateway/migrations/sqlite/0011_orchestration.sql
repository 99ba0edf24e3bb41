-- Orchestration (issue 30): tool calls waiting for an operator's approval, and the denials
-- remembered per (session, tool, arguments). Content-free: the tool's name, a summary naming
-- the arguments (never their values), and a SHA-256 digest of the canonical arguments.
CREATE TABLE approvals (
    id             TEXT PRIMARY KEY,
    session_key    TEXT NOT NULL,
    agent_id       TEXT NOT NULL,
    tool_name      TEXT NOT NULL,
    summary        TEXT NOT NULL,
    args_digest    TEXT NOT NULL,
    owner          TEXT NOT NULL,          -- whose turn asked
    run_id         TEXT,                   -- the background run, when the turn is one
    created_at     BIGINT NOT NULL,
    expires_at     BIGINT NOT NULL,
    status         TEXT NOT NULL,          -- pending | approved | denied | expired
    decided_by     TEXT,
    reason         TEXT,
    decided_at     BIGINT
);
CREATE INDEX approvals_by_status ON approvals (status, created_at);

CREATE TABLE approval_denials (
    session_key    TEXT NOT NULL,
    tool_name      TEXT NOT NULL,
    args_digest    TEXT NOT NULL,
    reason         TEXT,
    created_at     BIGINT NOT NULL,
    PRIMARY KEY (session_key, tool_name, args_digest)
);

-- What an operator asked of a run that another node holds (runs.claimed_by): killed or
-- revoked. The holder applies it within half a second (at once when the notification
-- arrives); the intent is in the row, so a node that missed the notification still obeys.
ALTER TABLE runs ADD COLUMN stop_requested TEXT;

-- Steering messages for runs another node holds, taken by the holder (not exported: state of
-- a running fleet).
CREATE TABLE run_steering (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id         TEXT NOT NULL,
    message        TEXT NOT NULL,
    created_at     BIGINT NOT NULL
);
CREATE INDEX run_steering_by_run ON run_steering (run_id, id);
