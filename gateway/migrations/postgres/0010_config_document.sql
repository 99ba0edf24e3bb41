-- The fleet's configuration (issue 27): the document in force, changed by config.* writes and
-- applied by every node sharing the database; the configuration file is the bootstrap. The
-- history (config_versions) keeps redacted copies; this row keeps the document itself, as the
-- file would (secrets included), so that every node can apply it.

CREATE TABLE config_document (
    id         BIGINT PRIMARY KEY CHECK (id = 1),
    document   TEXT NOT NULL,               -- JSON object, the configuration file's shape
    head_sha   TEXT,                        -- the history commit this document is
    updated_at BIGINT NOT NULL
);

-- Configuration files the fleet has read at a start, newest last: a file other than the newest
-- one read before is an operator's edit; what it changed since that one is recorded as a
-- commit and wins.
CREATE TABLE config_files_seen (
    digest   TEXT PRIMARY KEY,              -- hex SHA-256 of the file's document (JSON)
    document TEXT NOT NULL,                 -- that document (the base of the next edit)
    seen_at  BIGINT NOT NULL
);
