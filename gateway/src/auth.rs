//! Bearer tokens: lookup with constant-time comparison, scope expansion, and where a token
//! may come from (Authorization header, or the `token` query parameter for /ws and SSE).

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, RwLock};

use sha2::{Digest, Sha256};

use crate::api::generated::methods::Scope;
use crate::api::principal::Principal;
use crate::api::scopes::Scopes;
use crate::config::{TokenConfig, MIN_SECRET_LEN};

/// The principal whose bearer token the front layer already verified for this request (typed
/// POST routes: the token is checked before the body is read); the route's security scheme
/// uses it instead of verifying the same header twice.
#[derive(Debug, Clone)]
pub struct Verified(pub Principal);

/// One token as the request path sees it: who it authenticates, until when, and when it was
/// last used (kept in memory, written to the store in the background for API tokens).
pub struct Entry {
    pub principal: Principal,
    /// The scope names as configured or created.
    pub scopes: Vec<String>,
    /// API tokens: when the current secret was issued; None for configuration tokens.
    pub created_at: Option<i64>,
    pub expires_at: Option<i64>,
    pub last_used: AtomicI64,
    /// API tokens: the last use already written to the store.
    written: AtomicI64,
}

impl Entry {
    /// The last use, if any since it was issued (or, for a configuration token, since start).
    pub fn last_used_at(&self) -> Option<i64> {
        let used = self.last_used.load(Ordering::Relaxed);
        (used > 0).then_some(used)
    }
}

type Digests = HashMap<[u8; 32], Arc<Entry>>;

/// The tokens of `gateway.tokens[]` (fixed for a server generation) and the API tokens of the
/// store (changed at run time), both keyed by the SHA-256 digest of their secret.
///
/// One hash lookup per request, whatever the number of tokens. The lookup's timing depends on
/// the digest of what was presented, never on a secret: finding a secret from it would mean
/// inverting SHA-256.
pub struct TokenStore {
    config: Digests,
    /// None for a store of configuration tokens only (tests, the fuzz harness).
    api: Option<Arc<ApiTokens>>,
}

pub fn digest(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

/// Epoch ms now, for expiry and last use.
fn now() -> i64 {
    crate::clock::now_ms()
}

fn touch(e: &Entry) -> Principal {
    e.last_used.fetch_max(now(), Ordering::Relaxed);
    e.principal.clone()
}

pub fn expand(scopes: &[String]) -> Scopes {
    let named: Scopes = scopes.iter().filter_map(|s| Scope::from_name(s)).collect();
    if named.is_empty() || named.contains(Scope::All) {
        Scopes::all()
    } else {
        named
    }
}

impl TokenStore {
    /// The configuration's tokens only.
    pub fn new(tokens: &[TokenConfig]) -> Self {
        let config = tokens
            .iter()
            .map(|t| {
                if t.scopes.is_empty() {
                    tracing::warn!(token = %t.id, "token has no scopes: it grants every scope");
                }
                let entry = Entry {
                    principal: Principal::new(&t.id, expand(&t.scopes)),
                    scopes: t.scopes.clone(),
                    created_at: None,
                    expires_at: None,
                    last_used: AtomicI64::new(0),
                    written: AtomicI64::new(0),
                };
                (digest(&t.secret), Arc::new(entry))
            })
            .collect();
        Self { config, api: None }
    }

    /// Checks the store's API tokens too.
    pub fn with_api(mut self, api: Arc<ApiTokens>) -> Self {
        self.api = Some(api);
        self
    }

    /// The principal of the token whose secret is `presented`: a configuration token, else a
    /// live, unexpired API token.
    pub fn verify(&self, presented: &str) -> Option<Principal> {
        let d = digest(presented);
        match self.config.get(&d) {
            Some(e) => Some(touch(e)),
            None => self.api.as_ref().and_then(|a| a.verify(&d)),
        }
    }

    /// Authenticates a request: `Authorization: Bearer <token>`, or `?token=` when allowed.
    pub fn authenticate(&self, req: &poem::Request, allow_query: bool) -> Option<Principal> {
        presented_token(req, allow_query).and_then(|t| self.verify(&t))
    }

    /// The configuration's tokens (id, scopes, last use), sorted by id.
    pub fn config_tokens(&self) -> Vec<Arc<Entry>> {
        let mut v: Vec<Arc<Entry>> = self.config.values().cloned().collect();
        v.sort_by(|a, b| a.principal.client_id.cmp(&b.principal.client_id));
        v
    }

    /// Whether `id` is a configuration token's.
    pub fn is_config_id(&self, id: &str) -> bool {
        self.config.values().any(|e| e.principal.client_id == id)
    }

    /// Whether `p` still authenticates: a configuration token's, or a live API token's under
    /// the secret it authenticated with (a WebSocket checks this once registered, so a
    /// revocation between its authentication and its registration is not missed).
    pub fn is_current(&self, p: &Principal) -> bool {
        self.config.values().any(|e| e.principal.same(p))
            || self.api.as_ref().is_some_and(|a| a.is_current(p))
    }

    /// [`ApiTokens::watch`]: None without API tokens or for a configuration token.
    pub fn watch(&self, p: &Principal) -> Option<crate::hub::StreamWatch> {
        self.api.as_ref().and_then(|a| a.watch(p))
    }
}

/// The API tokens of the store, in memory for the request path: replaced as a whole on every
/// change (here or announced by another node), read under one uncontended read lock.
pub struct ApiTokens {
    store: crate::store::Store,
    /// The push hub: a token that stops working ends its streams there.
    hub: Arc<crate::hub::Hub>,
    live: RwLock<Arc<Digests>>,
}

impl ApiTokens {
    /// Loads the live tokens of the store.
    pub async fn open(
        store: crate::store::Store,
        hub: Arc<crate::hub::Hub>,
    ) -> Result<Self, crate::api::error::GatewayError> {
        let tokens = Self {
            store,
            hub,
            live: RwLock::default(),
        };
        tokens.reload().await?;
        Ok(tokens)
    }

    fn snapshot(&self) -> Arc<Digests> {
        self.live
            .read()
            .map(|m| m.clone())
            .unwrap_or_else(|p| p.into_inner().clone())
    }

    /// The principal of a live, unexpired token with this digest.
    pub fn verify(&self, d: &[u8; 32]) -> Option<Principal> {
        let live = self.live.read().ok()?;
        let e = live.get(d)?;
        if e.expires_at.is_some_and(|at| now() >= at) {
            return None;
        }
        Some(touch(e))
    }

    /// Reads the live tokens again. A secret still live keeps its entry (its principal, so
    /// connections made with it stay current, and its last use). Open connections of a token
    /// whose secret is no longer live (revoked, rotated) are ended: WebSockets close with 4001,
    /// event streams end. Every node runs this when a token changes anywhere in the fleet
    /// (the store's announcement), so this is where revocation reaches every node.
    pub async fn reload(&self) -> Result<(), crate::api::error::GatewayError> {
        let rows = self.store.tokens_all().await?;
        let before = self.snapshot();
        let mut next = Digests::new();
        for r in &rows {
            let Some(d) = r
                .digest
                .as_deref()
                .and_then(|h| hex::decode(h).ok())
                .and_then(|b| <[u8; 32]>::try_from(b).ok())
            else {
                continue;
            };
            let entry = match before.get(&d) {
                Some(kept) => kept.clone(),
                None => {
                    let scopes: Vec<String> = serde_json::from_str(&r.scopes).unwrap_or_default();
                    let named: Scopes = scopes.iter().filter_map(|s| Scope::from_name(s)).collect();
                    // An API token always names its scopes ("*" for all): nothing widens an
                    // empty set.
                    let granted = if named.contains(Scope::All) {
                        Scopes::all()
                    } else {
                        named
                    };
                    let used = r.last_used_at.unwrap_or(0);
                    Arc::new(Entry {
                        principal: Principal::api(&r.id, granted, r.expires_at),
                        scopes,
                        created_at: Some(r.created_at),
                        expires_at: r.expires_at,
                        last_used: AtomicI64::new(used),
                        written: AtomicI64::new(used),
                    })
                }
            };
            next.insert(d, entry);
        }
        let mut gone: Vec<&str> = before
            .iter()
            .filter(|(d, _)| !next.contains_key(*d))
            .map(|(_, e)| e.principal.client_id.as_str())
            .collect();
        gone.sort_unstable();
        gone.dedup();
        let next = Arc::new(next);
        if let Ok(mut live) = self.live.write() {
            *live = next.clone();
        }
        // After the swap: a connection registered from here on finds its principal gone when
        // it checks `is_current`; one registered before is ended here. A connection made with
        // the secret that is live now (a rotation's new one) is kept.
        for id in gone {
            let live_of_id: Vec<&Principal> = next
                .values()
                .map(|e| &e.principal)
                .filter(|p| p.client_id == id)
                .collect();
            let closed = self
                .hub
                .revoke(id, |p| live_of_id.iter().any(|l| l.same(p)));
            if closed > 0 {
                tracing::info!(client = %id, closed, "token revoked or rotated: its WebSockets are closed with 4001 and its event streams ended");
            }
        }
        Ok(())
    }

    /// Registers an event stream of `p` with the hub, so that revoking, rotating or expiring
    /// its token ends it; None for a principal whose token cannot be revoked (nothing to
    /// register, so streams of configuration tokens cost nothing here). A token revoked
    /// between the stream's authentication and this registration is noticed here.
    pub fn watch(&self, p: &Principal) -> Option<crate::hub::StreamWatch> {
        if !p.revocable() {
            return None;
        }
        let watch = self.hub.watch_stream(p);
        if !self.is_current(p) {
            watch.revoked().cancel();
        }
        Some(watch)
    }

    /// Whether `p` is the principal of a live token (same secret as when it authenticated).
    fn is_current(&self, p: &Principal) -> bool {
        self.snapshot().values().any(|e| e.principal.same(p))
    }

    /// The live tokens, sorted by id.
    pub fn list(&self) -> Vec<Arc<Entry>> {
        let mut out: Vec<Arc<Entry>> = self.snapshot().values().cloned().collect();
        out.sort_by(|a, b| a.principal.client_id.cmp(&b.principal.client_id));
        out
    }

    /// Writes last-use times that moved since they were last written.
    pub async fn flush(&self) -> Result<(), crate::api::error::GatewayError> {
        let live = self.snapshot();
        let moved: Vec<(&Arc<Entry>, i64)> = live
            .values()
            .filter_map(|e| {
                let at = e.last_used.load(Ordering::Relaxed);
                (at > e.written.load(Ordering::Relaxed)).then_some((e, at))
            })
            .collect();
        let used: Vec<(String, i64)> = moved
            .iter()
            .map(|(e, at)| (e.principal.client_id.clone(), *at))
            .collect();
        self.store.tokens_touch(&used).await?;
        for (e, at) in moved {
            e.written.fetch_max(at, Ordering::Relaxed);
        }
        Ok(())
    }
}

/// Writes API tokens' last-use times every `every` until `stop`, and once more at the end.
pub async fn flush_last_use(
    tokens: std::sync::Weak<ApiTokens>,
    every: std::time::Duration,
    stop: tokio_util::sync::CancellationToken,
) {
    loop {
        let stopped = tokio::select! {
            _ = stop.cancelled() => true,
            _ = tokio::time::sleep(every) => false,
        };
        let Some(t) = tokens.upgrade() else {
            return;
        };
        if let Err(e) = t.flush().await {
            tracing::warn!(error = %e, "token last-use times not written");
        }
        if stopped {
            return;
        }
    }
}

/// A new token secret: 32 bytes from the system's generator, URL-safe base64, prefixed so that
/// a leaked one is recognisable (47 characters).
pub fn new_secret() -> Result<String, crate::api::error::GatewayError> {
    use base64::Engine as _;
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 32];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| {
            crate::api::error::GatewayError::Internal("no randomness for a token".into())
        })?;
    Ok(format!(
        "agw_{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    ))
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
            crate::secrets::write_private_atomic(&path, &secret)?;
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
