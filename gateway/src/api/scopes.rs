//! A set of the catalogue's scopes as one machine word: every call context, turn and run
//! carries one, so copying it must cost nothing (a `BTreeSet` cost two allocations per copy on
//! the `/v1` path).

use crate::api::generated::methods::Scope;

/// A set of scopes. `Copy`; iteration follows the catalogue's order.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Scopes(u32);

// One bit per scope of the catalogue.
const _: () = assert!(Scope::ALL.len() <= 32);

const fn bit(s: Scope) -> u32 {
    1 << (s as u32)
}

impl Scopes {
    /// No scope.
    pub const EMPTY: Self = Self(0);

    /// Every scope of the catalogue.
    pub fn all() -> Self {
        Scope::ALL.into_iter().collect()
    }

    /// Exactly `s`.
    pub const fn only(s: Scope) -> Self {
        Self(bit(s))
    }

    pub const fn contains(self, s: Scope) -> bool {
        self.0 & bit(s) != 0
    }

    pub fn insert(&mut self, s: Scope) {
        self.0 |= bit(s);
    }

    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Whether a holder may use something requiring `scope`: `admin` includes `rpc`.
    pub const fn allows(self, scope: Scope) -> bool {
        self.contains(scope) || (matches!(scope, Scope::Rpc) && self.contains(Scope::Admin))
    }

    /// The scopes in the catalogue's order.
    pub fn iter(self) -> impl Iterator<Item = Scope> {
        Scope::ALL.into_iter().filter(move |s| self.contains(*s))
    }
}

impl FromIterator<Scope> for Scopes {
    fn from_iter<I: IntoIterator<Item = Scope>>(iter: I) -> Self {
        let mut set = Self::EMPTY;
        for s in iter {
            set.insert(s);
        }
        set
    }
}

impl<const N: usize> From<[Scope; N]> for Scopes {
    fn from(scopes: [Scope; N]) -> Self {
        scopes.into_iter().collect()
    }
}

impl std::fmt::Debug for Scopes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set()
            .entries(self.iter().map(Scope::as_str))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_set_holds_what_was_put_in_and_nothing_else() {
        let set = Scopes::from([Scope::Rpc, Scope::Api]);
        assert!(set.contains(Scope::Rpc) && set.contains(Scope::Api));
        assert!(!set.contains(Scope::Admin) && !set.contains(Scope::McpClient));
        assert_eq!(set.iter().collect::<Vec<_>>(), vec![Scope::Rpc, Scope::Api]);
        assert_eq!(format!("{set:?}"), r#"{"rpc", "api"}"#);
        assert!(Scopes::EMPTY.is_empty() && !set.is_empty());
        assert_eq!(Scopes::all().iter().count(), Scope::ALL.len());
    }

    #[test]
    fn admin_allows_rpc_but_nothing_else_it_does_not_hold() {
        let admin = Scopes::only(Scope::Admin);
        assert!(admin.allows(Scope::Rpc) && admin.allows(Scope::Admin));
        assert!(!admin.allows(Scope::Api) && !admin.allows(Scope::McpClient));
        assert!(!Scopes::only(Scope::Rpc).allows(Scope::Admin));
    }
}
