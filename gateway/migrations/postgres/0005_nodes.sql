-- Several gateway nodes on one database: see sqlite/0005_nodes.sql.

CREATE TABLE nodes (
    node_id     TEXT COLLATE "C" PRIMARY KEY,
    started_at  BIGINT NOT NULL,
    seen_at     BIGINT NOT NULL,
    host        TEXT,
    version     TEXT
);

CREATE TABLE leases (
    name        TEXT COLLATE "C" PRIMARY KEY,
    holder      TEXT COLLATE "C" NOT NULL,
    until_ms    BIGINT NOT NULL
);

CREATE TABLE fanout (
    id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    channel     TEXT NOT NULL,
    origin      TEXT NOT NULL,
    payload     TEXT NOT NULL,
    created_at  BIGINT NOT NULL
);
CREATE INDEX fanout_by_time ON fanout (created_at);
CREATE INDEX runs_by_status ON runs (status, claimed_by);
