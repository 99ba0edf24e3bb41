//! Who owns a session, a run, a cron job, a saved graph or a graph run, for the catalogue's ownership rules
//! (`tenancy::Owners`).

use super::sessions::{key_namespace, key_tenant};
use super::Store;
use crate::api::error::GatewayError;
use crate::api::generated::methods::RecordKind;
use crate::api::tenancy::{Lookup, Owners, Tenant};

impl Owners for Store {
    async fn lookup(
        &self,
        kind: RecordKind,
        id: &str,
        tenant: &Tenant,
    ) -> Result<Lookup, GatewayError> {
        let (sql, namespace) = match kind {
            RecordKind::Session => (
                "SELECT tenant_id FROM sessions WHERE session_key = $1",
                key_tenant(id),
            ),
            RecordKind::Run => ("SELECT client_id FROM runs WHERE run_id = $1", None),
            // A saved graph's id is unique per owner: the caller's own graph or nothing (every
            // caller, admin included, addresses its own graphs). Graph runs are looked up within
            // the caller's own too, so that deleteRun's claim of an unknown id answers another
            // tenant's run alike (the handlers read runs through the caller's tenant).
            RecordKind::Graph => {
                return self
                    .scoped_owner(
                        "SELECT owner FROM graphs WHERE id = $1 AND owner = $2",
                        id,
                        tenant,
                    )
                    .await
            }
            RecordKind::GraphRun => {
                return self
                    .scoped_owner(
                        "SELECT owner FROM graph_runs WHERE run_id = $1 AND owner = $2",
                        id,
                        tenant,
                    )
                    .await
            }
            // A job name is unique per owner: the caller's own job (or the runs a removed job
            // of the caller's left) or nothing.
            RecordKind::CronJob => {
                return self
                    .scoped_owner(
                        "SELECT owner FROM cron_jobs WHERE name = $1 AND owner = $2 \
                         UNION ALL SELECT owner FROM cron_runs WHERE job_name = $1 AND owner = $2 \
                         LIMIT 1",
                        id,
                        tenant,
                    )
                    .await
            }
            // A tenant id is compared by the rule itself, never looked up.
            RecordKind::Tenant | RecordKind::MemoryTenant => {
                return Ok(Lookup::Exists(Some(id.to_owned())))
            }
        };
        let owner: Option<Option<String>> = super::on_pool!(self.pool(), |p| {
            sqlx::query_scalar(sql).bind(id).fetch_optional(p).await?
        });
        Ok(match owner {
            // A row whose stored owner is not the tenant its canonical key names was written
            // before ownership rules (a key taken in another tenant's namespace): nobody's but
            // admin's, so neither the squatter nor the namespace's tenant continues it.
            Some(owner) if namespace.is_some() && owner != namespace => Lookup::Exists(None),
            Some(owner) => Lookup::Exists(owner),
            // Who may create it: the tenant part's own, except in an internal channel, whose
            // keys are the gateway's namespace (no token claims a heartbeat, webhook or cron
            // session before the gateway writes it).
            None => Lookup::Missing {
                namespace: namespace.and_then(|_| key_namespace(id)),
            },
        })
    }
}

impl Store {
    /// The owner of a record whose id is unique per owner, looked up within `tenant`'s own
    /// (`sql` binds the id as $1 and the tenant as $2): the caller's own record or nothing.
    async fn scoped_owner(
        &self,
        sql: &'static str,
        id: &str,
        tenant: &Tenant,
    ) -> Result<Lookup, GatewayError> {
        let owner: Option<String> = super::on_pool!(self.pool(), |p| {
            sqlx::query_scalar(sql)
                .bind(id)
                .bind(tenant.only())
                .fetch_optional(p)
                .await?
        });
        Ok(match owner {
            Some(o) => Lookup::Exists(Some(o)),
            None => Lookup::Missing { namespace: None },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::sessions::{
        is_internal_principal, key_namespace, key_tenant, session_key, InternalChannel,
    };

    #[test]
    fn the_tenant_of_a_canonical_key_round_trips() {
        for tenant in ["alice", "t:1", "50%", "%3A", "", "ü"] {
            let key = session_key("bot", "api", tenant, "main");
            assert_eq!(key_tenant(&key).as_deref(), Some(tenant), "{key}");
        }
        for other in [
            "free-form",
            "agent:a:b:c",
            "agent:a:b:c:d:e",
            "x:a:b:c:d",
            "agent:a:b:%zz:d",
        ] {
            assert_eq!(key_tenant(other), None, "{other}");
        }
    }

    #[test]
    fn internal_channel_keys_are_in_the_gateways_namespace() {
        // Heartbeat and webhook sessions belong to the gateway's own principals.
        let hb = session_key("bot", "heartbeat", "system", "main");
        assert_eq!(key_tenant(&hb).as_deref(), Some("heartbeat:system"));
        let wh = session_key("bot", "webhook", "echo", "d1");
        assert_eq!(key_tenant(&wh).as_deref(), Some("webhook:echo"));
        // A cron session belongs to its job's owner, who reads it ...
        let cron = session_key("bot", "cron", "alice", "job1");
        assert_eq!(key_tenant(&cron).as_deref(), Some("alice"));
        // ... but no token creates one: every internal key's namespace is internal.
        for c in InternalChannel::ALL {
            for tenant in ["system", "echo", "alice", ""] {
                let key = session_key("bot", c.label(), tenant, "main");
                let ns = key_namespace(&key).unwrap();
                assert!(is_internal_principal(&ns), "{key}: {ns}");
            }
            assert_eq!(InternalChannel::of(c.label()), Some(c));
        }
        // Other channels: the tenant part, as before.
        let api = session_key("bot", "api", "alice", "main");
        assert_eq!(key_namespace(&api).as_deref(), Some("alice"));
        assert_eq!(key_namespace("free-form"), None);
        // Heartbeat and webhook owners are internal principals; token ids never are.
        for c in [InternalChannel::Heartbeat, InternalChannel::Webhook] {
            assert!(is_internal_principal(&c.owner("system")));
        }
        assert!(!is_internal_principal("system"));
    }
}
