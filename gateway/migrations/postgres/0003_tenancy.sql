-- Tenant ownership: see sqlite/0003_tenancy.sql (the UPDATE is kept for parity; a new
-- PostgreSQL database has no rows for it to change).
ALTER TABLE memories ADD COLUMN tenant_id TEXT COLLATE "C";
CREATE INDEX memories_by_tenant ON memories (tenant_id, agent_id);

UPDATE sessions SET tenant_id = channel || ':' || COALESCE(tenant_id, '')
WHERE channel IN ('webhook', 'heartbeat') AND (tenant_id IS NULL OR tenant_id NOT LIKE '%:%');

CREATE INDEX runs_by_client ON runs (client_id, started_at);
