//! Tenant ownership: whose records a caller may reach ([`Tenant`], derived from an
//! authenticated principal only), who owns a record ([`Owners`], implemented by the store), and
//! the rule the generated dispatch applies to every method the catalogue gives an `owner`.
//!
//! Store functions that read or write owned records take a `&Tenant`, and a `Tenant` comes only
//! from a [`crate::api::principal::Principal`] (or the call context built from one): a handler cannot reach
//! another tenant's rows by forgetting a check, because it has no other way to name a tenant.

use std::future::Future;
use std::sync::Arc;

use crate::api::error::GatewayError;
use crate::api::generated::methods::RecordKind;

/// Whose records a caller may reach: every tenant's (admin) or one tenant's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant(Reach);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Reach {
    Any,
    Only(Arc<str>),
}

impl Tenant {
    /// Built by [`crate::api::principal::Principal::tenant`] only.
    pub(crate) fn for_principal(client_id: &str, admin: bool) -> Self {
        if admin {
            Self(Reach::Any)
        } else {
            Self(Reach::Only(Arc::from(client_id)))
        }
    }

    /// The reach of exactly one owner, for engine code acting on a record whose owner it has
    /// already checked (a turn reading the history of the session it was authorized for).
    pub(crate) fn owner(owner: &str) -> Self {
        Self(Reach::Only(Arc::from(owner)))
    }

    /// The reach of one owner for offline tools built on the library (benches), which act with
    /// no principal. The server never uses it.
    #[doc(hidden)]
    pub fn offline(owner: &str) -> Self {
        Self::owner(owner)
    }

    /// Whether the caller reaches every tenant (admin).
    pub fn is_any(&self) -> bool {
        matches!(self.0, Reach::Any)
    }

    /// The one tenant the caller is restricted to; None for admin. Bound as an SQL parameter
    /// in `(? IS NULL OR tenant_id = ?)` filters.
    pub fn only(&self) -> Option<&str> {
        match &self.0 {
            Reach::Any => None,
            Reach::Only(t) => Some(t),
        }
    }

    /// Whether a record owned by `owner` (None: by nobody) is within reach.
    pub fn reaches(&self, owner: Option<&str>) -> bool {
        match &self.0 {
            Reach::Any => true,
            Reach::Only(t) => owner == Some(&**t),
        }
    }
}

/// Who owns a record, as the store knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// The record exists; its owner (None: stored without one, reachable by admin only).
    Exists(Option<String>),
    /// No such record. `namespace` is the tenant its id names when the id has a canonical form
    /// (a session key `agent:<agent>:<channel>:<tenant>:<user>`), else None.
    Missing { namespace: Option<String> },
}

/// Owner lookups for the ownership rules of the catalogue (implemented by the store).
pub trait Owners: Send + Sync {
    /// Who owns the record `id` of `kind`, as `tenant` (never admin) names it. Only called for
    /// kinds with `lookup: true`. Most ids name one record whoever asks; a cron job's name is
    /// unique per owner, so it names the caller's own job or none.
    fn lookup(
        &self,
        kind: RecordKind,
        id: &str,
        tenant: &Tenant,
    ) -> impl Future<Output = Result<Lookup, GatewayError>> + Send;
}

/// Whether `tenant` may use the record `id` of `kind` under a rule that allows (`claim`) or
/// refuses creating a missing record.
pub async fn allowed<O: Owners>(
    owners: &O,
    tenant: &Tenant,
    kind: RecordKind,
    claim: bool,
    id: &str,
) -> Result<bool, GatewayError> {
    if tenant.is_any() {
        return Ok(true);
    }
    if !kind.lookup() {
        return Ok(tenant.reaches(Some(id)));
    }
    Ok(match owners.lookup(kind, id, tenant).await? {
        Lookup::Exists(owner) => tenant.reaches(owner.as_deref()),
        Lookup::Missing { namespace } => {
            claim && namespace.as_deref().is_none_or(|n| tenant.reaches(Some(n)))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed(Lookup);

    impl Owners for Fixed {
        async fn lookup(
            &self,
            _kind: RecordKind,
            _id: &str,
            _tenant: &Tenant,
        ) -> Result<Lookup, GatewayError> {
            Ok(self.0.clone())
        }
    }

    fn exists(owner: Option<&str>) -> Fixed {
        Fixed(Lookup::Exists(owner.map(str::to_owned)))
    }

    fn missing(namespace: Option<&str>) -> Fixed {
        Fixed(Lookup::Missing {
            namespace: namespace.map(str::to_owned),
        })
    }

    #[tokio::test]
    async fn the_rule_for_every_case() {
        let alice = Tenant::for_principal("alice", false);
        let admin = Tenant::for_principal("root", true);
        let s = RecordKind::Session;
        let check = |o: Fixed, t: Tenant, claim: bool| async move {
            allowed(&o, &t, s, claim, "k").await.unwrap()
        };
        // An existing record: its owner only (admin: any); a record without owner: admin only.
        assert!(check(exists(Some("alice")), alice.clone(), false).await);
        assert!(!check(exists(Some("mallory")), alice.clone(), false).await);
        assert!(!check(exists(Some("mallory")), alice.clone(), true).await);
        assert!(!check(exists(None), alice.clone(), false).await);
        assert!(check(exists(Some("mallory")), admin.clone(), false).await);
        // A missing record: refused unless the rule claims, then only in one's own namespace.
        assert!(!check(missing(None), alice.clone(), false).await);
        assert!(check(missing(None), alice.clone(), true).await);
        assert!(check(missing(Some("alice")), alice.clone(), true).await);
        assert!(!check(missing(Some("mallory")), alice.clone(), true).await);
        assert!(check(missing(Some("mallory")), admin.clone(), false).await);
        // A tenant id is compared, never looked up.
        let t = RecordKind::Tenant;
        assert!(allowed(&missing(None), &alice, t, false, "alice")
            .await
            .unwrap());
        assert!(!allowed(&missing(None), &alice, t, false, "mallory")
            .await
            .unwrap());
        assert!(allowed(&missing(None), &admin, t, false, "mallory")
            .await
            .unwrap());
    }
}
