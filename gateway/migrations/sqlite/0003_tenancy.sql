-- Tenant ownership (catalogue owners.yaml). Memories belong to the tenant of the turn that
-- stored them; rows stored before this migration have none and are reachable by admin only.
ALTER TABLE memories ADD COLUMN tenant_id TEXT;
CREATE INDEX memories_by_tenant ON memories (tenant_id, agent_id);

-- Sessions of the gateway's own channels belong to its internal principals (`webhook:<mapping>`,
-- `heartbeat:system`), which no token can be (token ids cannot contain ':').
UPDATE sessions SET tenant_id = channel || ':' || COALESCE(tenant_id, '')
WHERE channel IN ('webhook', 'heartbeat') AND (tenant_id IS NULL OR tenant_id NOT LIKE '%:%');

CREATE INDEX runs_by_client ON runs (client_id, started_at);
