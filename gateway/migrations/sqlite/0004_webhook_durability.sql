-- Webhook durability: signed deliveries already seen (the replay guard, kept across restarts
-- until they expire), and what a queued webhook run needs to start after a restart.

CREATE TABLE webhook_deliveries (
    delivery    TEXT PRIMARY KEY,       -- hex SHA-256 over the endpoint path and the body's SHA-256
    expires_at  BIGINT NOT NULL         -- epoch ms; a redelivery after this runs again
);
CREATE INDEX webhook_deliveries_by_expiry ON webhook_deliveries (expires_at);

-- JSON of what the run needs besides the row itself (agent, session parts, model, timeout);
-- set only for runs that may be resumed (queued webhook runs).
ALTER TABLE runs ADD COLUMN resume TEXT;
-- The process (a random id per process) that holds a queued run; a new process takes over
-- queued runs another process held.
ALTER TABLE runs ADD COLUMN claimed_by TEXT;
