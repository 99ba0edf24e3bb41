//! Who is calling: the authenticated principal (a shared pointer, cloned per request) and its
//! identity (client id, scopes, the tenant derived from them, revocability and expiry).

use std::sync::Arc;

use super::generated::methods::Scope;
use super::scopes::Scopes;
use super::tenancy::Tenant;
use super::CallContext;

/// Owner of operator-only events (`audit:event`, `secret:*`): an id no token can have, so
/// only admin subscribers see them.
pub const OPERATOR: &str = "gateway:operator";

fn now() -> i64 {
    crate::clock::now_ms()
}

/// An authenticated caller. Cloned once or more for every request (the route's security
/// scheme, the call context, a turn, an admission permit), so it is a shared pointer.
#[derive(Debug, Clone)]
pub struct Principal(Arc<Identity>);

/// Who a principal is: its client id and scopes, and the tenant derived from them.
#[derive(Debug)]
pub struct Identity {
    pub client_id: String,
    pub scopes: Scopes,
    /// Whose records it reaches (derived from the two above when it is built).
    tenant: Tenant,
    /// Whether it authenticated with an API token of the store, which can be revoked, rotated
    /// or expire while its connections are open (configuration tokens last as long as their
    /// server generation, and internal principals have no token).
    revocable: bool,
    /// An API token's `expiresAt` (epoch ms), fixed for the secret it authenticated with.
    expires_at: Option<i64>,
}

impl Identity {
    /// Whether its connections have to be ended when its token stops working (an API token's).
    pub fn revocable(&self) -> bool {
        self.revocable
    }

    /// When its token expires (epoch ms), if it does.
    pub fn expires_at(&self) -> Option<i64> {
        self.expires_at
    }

    /// Whether its token has expired by now.
    pub fn expired(&self) -> bool {
        self.expires_at.is_some_and(|at| now() >= at)
    }

    /// Whose records this caller reaches: every tenant's with `admin`, else its own.
    pub fn tenant(&self) -> &Tenant {
        &self.tenant
    }

    /// The one tenant a method acting on a single tenant's records works in (the memory
    /// methods): `named` when the caller reaches it, else the caller's own. The `memory_tenant`
    /// ownership rule has refused another tenant's name for a caller without admin before a
    /// handler runs; falling back to the caller's own never widens its reach.
    pub fn tenant_named(&self, named: Option<&str>) -> (Tenant, String) {
        let id = match named {
            Some(n) if self.tenant.reaches(Some(n)) => n,
            _ => self.client_id.as_str(),
        };
        (Tenant::owner(id), id.to_owned())
    }

    /// Whether the caller may use something requiring `scope`. `admin` includes `rpc`.
    pub fn allows(&self, scope: Scope) -> bool {
        self.scopes.allows(scope)
    }
}

impl std::ops::Deref for Principal {
    type Target = Identity;

    fn deref(&self) -> &Identity {
        &self.0
    }
}

impl Principal {
    /// The principal of work the gateway starts itself (webhook runs, heartbeats): its client
    /// id names the records it owns (`webhook:<mapping>`), and it holds scope `rpc` only.
    pub fn internal(client_id: &str) -> Self {
        Self::new(client_id, Scopes::only(Scope::Rpc))
    }

    pub(crate) fn new(client_id: &str, scopes: Scopes) -> Self {
        Self::built(client_id, scopes, false, None)
    }

    /// The principal of an API token of the store (revocable, possibly expiring).
    pub(crate) fn api(client_id: &str, scopes: Scopes, expires_at: Option<i64>) -> Self {
        Self::built(client_id, scopes, true, expires_at)
    }

    fn built(client_id: &str, scopes: Scopes, revocable: bool, expires_at: Option<i64>) -> Self {
        Self(Arc::new(Identity {
            tenant: Tenant::for_principal(client_id, scopes.contains(Scope::Admin)),
            client_id: client_id.to_owned(),
            scopes,
            revocable,
            expires_at,
        }))
    }

    /// Whether `self` and `other` are the same authentication (one token secret, one server
    /// generation), not merely the same client id.
    pub fn same(&self, other: &Principal) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    pub fn context(&self, connection: Option<u64>) -> CallContext {
        CallContext {
            principal: self.clone(),
            connection,
        }
    }
}
