-- Graphs: workflow definitions a client saves to run again, and the runs of graphs (the
-- PostgreSQL form of sqlite/0012_graphs.sql). Keys and sorted text are COLLATE "C", so
-- listings and exports order as SQLite's BINARY does.
--
-- `graphs`: one saved definition per (owner, id); the id is the owner's own name for it, so
-- two owners may each have a graph called `nightly`. `definition` is the graph as JSON, kept
-- as given: the store never reads inside it. An update keeps `created_at`.
CREATE TABLE graphs (
    owner          TEXT COLLATE "C" NOT NULL,  -- the client id that saved it
    id             TEXT COLLATE "C" NOT NULL,  -- unique within its owner only
    label          TEXT NOT NULL,
    agent_id       TEXT COLLATE "C",           -- the agent its nodes run as by default
    definition     TEXT NOT NULL,              -- JSON, opaque to the store
    node_count     BIGINT NOT NULL,
    created_at     BIGINT NOT NULL,
    updated_at     BIGINT NOT NULL,
    PRIMARY KEY (owner, id)
);
CREATE INDEX graphs_by_update ON graphs (owner, updated_at);

-- `graph_runs`: one row per execution of a graph, saved or given inline, with its progress
-- counters and the per-node state as JSON (opaque to the store). While a run is pending or
-- running, `claimed_by` names the node executing it (as runs.claimed_by does); a run whose
-- node is gone is ended as failed by the orphan sweep, and a final status clears the holder.
-- `cancel_requested` (0/1) is how a cancel reaches a run another node holds.
CREATE TABLE graph_runs (
    run_id           TEXT COLLATE "C" PRIMARY KEY,
    owner            TEXT COLLATE "C" NOT NULL,  -- the client id that started it
    definition_id    TEXT COLLATE "C",           -- the saved graph it ran, if any
    label            TEXT,
    status           TEXT COLLATE "C" NOT NULL,  -- pending | running | completed | failed |
                                                 -- cancelled
    node_count       BIGINT NOT NULL,
    completed_nodes  BIGINT NOT NULL,
    failed_nodes     BIGINT NOT NULL,
    artifact_count   BIGINT NOT NULL,
    created_at       BIGINT NOT NULL,
    started_at       BIGINT,
    completed_at     BIGINT,
    error            TEXT,
    nodes            TEXT NOT NULL,              -- JSON of each node's state, opaque to the store
    claimed_by       TEXT COLLATE "C",           -- the node holding a live run; NULL once it ended
    cancel_requested BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX graph_runs_by_owner ON graph_runs (owner, created_at);
CREATE INDEX graph_runs_by_status ON graph_runs (status);
