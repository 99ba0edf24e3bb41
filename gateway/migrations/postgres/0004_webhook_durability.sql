-- Webhook durability: see sqlite/0004_webhook_durability.sql.
CREATE TABLE webhook_deliveries (
    delivery    TEXT COLLATE "C" PRIMARY KEY,
    expires_at  BIGINT NOT NULL
);
CREATE INDEX webhook_deliveries_by_expiry ON webhook_deliveries (expires_at);

ALTER TABLE runs ADD COLUMN resume TEXT;
ALTER TABLE runs ADD COLUMN claimed_by TEXT COLLATE "C";
