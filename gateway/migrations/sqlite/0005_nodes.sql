-- Several gateway processes on one database (PostgreSQL; the tables exist on SQLite too so the
-- two schemas stay one). `nodes`: each process's heartbeat; a node unseen for
-- `store.nodeDeadAfterMs` is dead, and the queued runs it held are taken over. `leases`: work
-- done once across the fleet (sweeps), held by one node until `until_ms`. `fanout`: notification
-- bodies too large for a PostgreSQL NOTIFY, referenced by id from the notification.
-- runs.claimed_by now names the node that runs or holds a run (queued or running).

CREATE TABLE nodes (
    node_id     TEXT PRIMARY KEY,
    started_at  BIGINT NOT NULL,
    seen_at     BIGINT NOT NULL,
    host        TEXT,
    version     TEXT
);

CREATE TABLE leases (
    name        TEXT PRIMARY KEY,
    holder      TEXT NOT NULL,
    until_ms    BIGINT NOT NULL
);

CREATE TABLE fanout (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    channel     TEXT NOT NULL,
    origin      TEXT NOT NULL,
    payload     TEXT NOT NULL,
    created_at  BIGINT NOT NULL
);
CREATE INDEX fanout_by_time ON fanout (created_at);
CREATE INDEX runs_by_status ON runs (status, claimed_by);
