//! The one resolver outbound HTTP clients use ([`Resolve`], a `tower` service hyper-util's
//! `HttpConnector` calls for a host name), over an injectable [`Lookup`]. Two sources: a lookup
//! whose answer is filtered through a [`NetPolicy`] (the refused addresses dropped; none left:
//! the connection fails naming one), or a pinned list of addresses vetted beforehand, which
//! answers the name without looking anything up again (the fetcher's hops: the address
//! checked is the address connected to, whatever DNS says a moment later).

use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::client::legacy::connect::dns::Name;

use super::policy::{is_localhost, NetPolicy};

/// Longest wait for one lookup.
pub const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// What a lookup returns.
pub type LookupFuture = Pin<Box<dyn Future<Output = io::Result<Vec<IpAddr>>> + Send>>;

/// Turns a host name into addresses: the system resolver in production, anything in tests.
pub trait Lookup: Send + Sync + 'static {
    fn lookup(&self, host: &str) -> LookupFuture;
}

/// The system resolver (`getaddrinfo` on a blocking thread, through tokio); `localhost` names
/// are answered with 127.0.0.1 and ::1 without asking it (RFC 6761).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemLookup;

impl Lookup for SystemLookup {
    fn lookup(&self, host: &str) -> LookupFuture {
        if is_localhost(host) {
            return Box::pin(async {
                Ok(vec![
                    IpAddr::from([127, 0, 0, 1]),
                    IpAddr::from([0u16, 0, 0, 0, 0, 0, 0, 1]),
                ])
            });
        }
        let host = host.to_owned();
        Box::pin(async move {
            let found = tokio::net::lookup_host((host.as_str(), 0)).await?;
            Ok(found.map(|a| a.ip()).collect())
        })
    }
}

#[derive(Clone)]
enum Source {
    Lookup(Arc<dyn Lookup>),
    Pinned(Arc<[IpAddr]>),
}

/// The resolver of an `HttpConnector`.
#[derive(Clone)]
pub struct Resolve {
    source: Source,
    /// Drops the addresses this policy refuses from a lookup's answer.
    guard: Option<Arc<NetPolicy>>,
}

impl Resolve {
    /// Looks names up with `lookup`; with a guard, refused addresses are dropped.
    pub fn new(lookup: Arc<dyn Lookup>, guard: Option<Arc<NetPolicy>>) -> Self {
        Self {
            source: Source::Lookup(lookup),
            guard,
        }
    }

    /// The system resolver, guarded or not.
    pub fn system(guard: Option<Arc<NetPolicy>>) -> Self {
        Self::new(Arc::new(SystemLookup), guard)
    }

    /// Answers every name with `addresses` (already vetted) and never looks anything up.
    pub fn pinned(addresses: Vec<IpAddr>) -> Self {
        Self {
            source: Source::Pinned(addresses.into()),
            guard: None,
        }
    }
}

impl tower_service::Service<Name> for Resolve {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, io::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), io::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let lookup = match &self.source {
            Source::Pinned(addresses) => {
                let found: Vec<SocketAddr> =
                    addresses.iter().map(|ip| SocketAddr::new(*ip, 0)).collect();
                return Box::pin(async move { Ok(found.into_iter()) });
            }
            Source::Lookup(lookup) => lookup.lookup(name.as_str()),
        };
        let guard = self.guard.clone();
        Box::pin(async move {
            let found = tokio::time::timeout(LOOKUP_TIMEOUT, lookup)
                .await
                .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "the lookup timed out"))??;
            let Some(guard) = guard else {
                return Ok(found
                    .into_iter()
                    .map(|ip| SocketAddr::new(ip, 0))
                    .collect::<Vec<_>>()
                    .into_iter());
            };
            let mut refused = None;
            let mut allowed = Vec::with_capacity(found.len());
            for ip in found {
                match guard.refused(ip) {
                    Some(class) => {
                        refused = Some(format!(
                            "{} resolves to {ip}, a {class} address the policy refuses",
                            name.as_str()
                        ));
                    }
                    None => allowed.push(SocketAddr::new(ip, 0)),
                }
            }
            match (allowed.is_empty(), refused) {
                (true, Some(why)) => Err(io::Error::new(io::ErrorKind::PermissionDenied, why)),
                _ => Ok(allowed.into_iter()),
            }
        })
    }
}
