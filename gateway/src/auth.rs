//! Bearer tokens: lookup with constant-time comparison, scope expansion, and where a token
//! may come from (Authorization header, or the `token` query parameter for /ws and SSE).

use std::borrow::Cow;
use std::path::Path;
use std::sync::Arc;

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::config::{TokenConfig, MIN_SECRET_LEN};
use crate::rpc::generated::methods::Scope;
use crate::rpc::CallContext;
use crate::scopes::Scopes;
use crate::tenancy::Tenant;

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
}

impl Identity {
    /// Whose records this caller reaches: every tenant's with `admin`, else its own.
    pub fn tenant(&self) -> &Tenant {
        &self.tenant
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

    fn new(client_id: &str, scopes: Scopes) -> Self {
        Self(Arc::new(Identity {
            tenant: Tenant::for_principal(client_id, scopes.contains(Scope::Admin)),
            client_id: client_id.to_owned(),
            scopes,
        }))
    }

    pub fn context(&self, connection: Option<u64>) -> CallContext {
        CallContext {
            principal: self.clone(),
            connection,
        }
    }
}

/// The principal whose bearer token the front layer already verified for this request (typed
/// POST routes: the token is checked before the body is read); the route's security scheme
/// uses it instead of verifying the same header twice.
#[derive(Debug, Clone)]
pub struct Verified(pub Principal);

struct Entry {
    digest: [u8; 32],
    principal: Principal,
}

/// The configured tokens, kept as digests of their secrets.
pub struct TokenStore {
    entries: Vec<Entry>,
}

fn digest(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

fn expand(scopes: &[String]) -> Scopes {
    let named: Scopes = scopes.iter().filter_map(|s| Scope::from_name(s)).collect();
    if named.is_empty() || named.contains(Scope::All) {
        Scopes::all()
    } else {
        named
    }
}

impl TokenStore {
    pub fn new(tokens: &[TokenConfig]) -> Self {
        let entries = tokens
            .iter()
            .map(|t| {
                if t.scopes.is_empty() {
                    tracing::warn!(token = %t.id, "token has no scopes: it grants every scope");
                }
                Entry {
                    digest: digest(&t.secret),
                    principal: Principal::new(&t.id, expand(&t.scopes)),
                }
            })
            .collect();
        Self { entries }
    }

    /// Finds the token whose secret equals `presented`. Every entry is compared, each in
    /// constant time over equal-length digests, so timing says nothing about the secrets.
    pub fn verify(&self, presented: &str) -> Option<&Principal> {
        let d = digest(presented);
        let mut found = None;
        for e in &self.entries {
            if bool::from(e.digest.ct_eq(&d)) {
                found = Some(&e.principal);
            }
        }
        found
    }

    /// Authenticates a request: `Authorization: Bearer <token>`, or `?token=` when allowed.
    pub fn authenticate(&self, req: &poem::Request, allow_query: bool) -> Option<&Principal> {
        presented_token(req, allow_query).and_then(|t| self.verify(&t))
    }
}

/// The token a request presents, if any (borrowed from the header; the query form is
/// percent-decoded).
pub fn presented_token(req: &poem::Request, allow_query: bool) -> Option<Cow<'_, str>> {
    if let Some(h) = req.headers().get(http::header::AUTHORIZATION) {
        let h = h.to_str().ok()?;
        let (scheme, token) = h.split_once(' ')?;
        return scheme
            .eq_ignore_ascii_case("bearer")
            .then(|| Cow::Borrowed(token.trim()));
    }
    if allow_query {
        let query = req.uri().query()?;
        return url::form_urlencoded::parse(query.as_bytes())
            .find(|(k, _)| k == "token")
            .map(|(_, v)| v);
    }
    None
}

/// With no tokens configured, the gateway never runs open: it uses (creating on first run) a
/// local all-scopes token stored in `<dataDir>/local-token` (mode 0600) and logs its path only.
pub fn local_token(data_dir: &Path) -> std::io::Result<TokenConfig> {
    let path = data_dir.join("local-token");
    let secret = match std::fs::read_to_string(&path) {
        Ok(s) if s.trim().chars().count() >= MIN_SECRET_LEN => s.trim().to_owned(),
        _ => {
            let secret = format!(
                "{}{}",
                uuid::Uuid::new_v4().simple(),
                uuid::Uuid::new_v4().simple()
            );
            write_private(&path, &secret)?;
            secret
        }
    };
    tracing::info!(path = %path.display(), "no gateway.tokens configured: using the local token stored in this file");
    Ok(TokenConfig {
        id: "local".to_owned(),
        secret,
        scopes: vec!["*".to_owned()],
    })
}

fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut f = opts.open(path)?;
    f.write_all(text.as_bytes())
}
