-- The control plane (issue 16): API tokens, the encrypted secret store and auth profiles, and
-- the configuration's history and audit log. Times are epoch milliseconds; flags are 0/1.

CREATE TABLE api_tokens (
    id           TEXT PRIMARY KEY,          -- the client id (tenant) the token authenticates as
    digest       TEXT,                      -- hex SHA-256 of the secret; NULL once revoked
    scopes       TEXT NOT NULL,             -- JSON array of scope names
    created_at   BIGINT NOT NULL,
    expires_at   BIGINT,
    last_used_at BIGINT,
    revoked_at   BIGINT                     -- revoked ids stay reserved (their records keep a tenant)
);
CREATE UNIQUE INDEX api_tokens_digest ON api_tokens (digest) WHERE digest IS NOT NULL;

CREATE TABLE secrets (
    name        TEXT PRIMARY KEY,           -- [A-Z][A-Z0-9_]*; lowercase names are the store's own
    nonce       TEXT NOT NULL,              -- base64, 12 bytes, fresh per write
    ciphertext  TEXT NOT NULL,              -- base64 AES-256-GCM (tag included), name as AAD
    provider    TEXT,
    description TEXT,
    expires_at  BIGINT,
    created_at  BIGINT NOT NULL,
    updated_at  BIGINT NOT NULL
);

CREATE TABLE auth_profiles (
    profile_id   TEXT PRIMARY KEY,
    provider     TEXT NOT NULL,
    nonce        TEXT NOT NULL,
    ciphertext   TEXT NOT NULL,             -- JSON {access, refresh} encrypted, profile id as AAD
    expires      BIGINT NOT NULL,
    account_id   TEXT,
    email        TEXT,
    display_name TEXT,
    created_at   BIGINT NOT NULL,
    updated_at   BIGINT NOT NULL
);

CREATE TABLE config_versions (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    sha        TEXT NOT NULL UNIQUE,        -- hex SHA-256 of parent, document, message and time
    parent     TEXT,                        -- NULL for a root
    message    TEXT NOT NULL,
    author     TEXT,                        -- client id of the token that made the change
    section    TEXT,
    key        TEXT,
    document   TEXT NOT NULL,               -- the file's document as JSON, secrets redacted
    created_at BIGINT NOT NULL
);

CREATE TABLE config_audit (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    ts         BIGINT NOT NULL,
    pid        BIGINT NOT NULL,
    origin     TEXT NOT NULL,               -- rpc | cli | startup | external
    method     TEXT,
    client_id  TEXT,
    paths      TEXT NOT NULL,               -- JSON array of changed dot paths (never values)
    commit_sha TEXT,
    suspicious BIGINT NOT NULL DEFAULT 0,
    reasons    TEXT NOT NULL                -- JSON array
);
CREATE INDEX config_audit_ts ON config_audit (ts);
