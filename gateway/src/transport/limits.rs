//! HTTP limits: the global rate limiter (governor's GCRA keyed by client address, IPv6 grouped
//! by /64, the client found behind `gateway.trustedProxies`) and the POST body reader that
//! counts bytes actually read (chunked bodies too) under a read deadline.

use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use governor::clock::Clock;
use governor::{DefaultKeyedRateLimiter, Quota};
use http::HeaderMap;
use ipnet::IpNet;

/// Paths that the rate limit never counts.
pub const RATE_EXEMPT: &[&str] = &["/health", "/api/health"];

/// Every this many checks, keys idle for a whole window are dropped, so the limiter's memory
/// follows the clients active in one window, not every address ever seen.
const RETAIN_EVERY: u32 = 4096;

/// Requests per client address: `maxRequests` at once, refilled evenly over `windowMs`.
pub struct RateLimiter {
    /// Keys are client addresses, which a client chooses: foldhash's seeded `quality` hasher
    /// (governor's default is SipHash, twice the cost per request).
    limiter: DefaultKeyedRateLimiter<
        IpAddr,
        governor::middleware::NoOpMiddleware<governor::clock::QuantaInstant>,
        foldhash::quality::RandomState,
    >,
    window: Duration,
    proxies: TrustedProxies,
    checks: AtomicU32,
}

/// The rate-limit key `front` found for a request (a request extension).
#[derive(Debug, Clone, Copy)]
pub struct RateKey(pub IpAddr);

/// A refused request: how long until it would be admitted.
pub struct Limited {
    pub retry_after: Duration,
}

impl RateLimiter {
    /// `max` requests per `window` for each client address; `proxies` are the peers whose
    /// forwarding headers are believed.
    pub fn new(window: Duration, max: u64, proxies: TrustedProxies) -> Self {
        let burst =
            NonZeroU32::new(u32::try_from(max).unwrap_or(u32::MAX)).unwrap_or(NonZeroU32::MIN);
        let period = (window / burst.get()).max(Duration::from_nanos(1));
        let quota = Quota::with_period(period)
            .unwrap_or_else(|| Quota::per_second(burst))
            .allow_burst(burst);
        Self {
            limiter: governor::RateLimiter::dashmap_with_hasher(
                quota,
                foldhash::quality::RandomState::default(),
            ),
            window,
            proxies,
            checks: AtomicU32::new(0),
        }
    }

    /// The limiter of `gateway.rateLimit` and `gateway.trustedProxies` (validated at load: an
    /// entry that does not parse here was refused there).
    pub fn from_config(g: &crate::config::GatewayConfig) -> Self {
        let proxies = TrustedProxies::parse(&g.trusted_proxies).unwrap_or_default();
        Self::new(
            Duration::from_millis(g.rate_limit.window_ms),
            g.rate_limit.max_requests,
            proxies,
        )
    }

    /// The rate-limit key of a request from TCP peer `peer`: the client address (see
    /// [`TrustedProxies::client_ip`]) with IPv6 grouped by /64.
    pub fn key(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        client_key(self.proxies.client_ip(peer, headers))
    }

    /// Counts one request under `key`; refused requests are not counted.
    pub fn check(&self, key: IpAddr) -> Result<(), Limited> {
        self.check_n(key, 1)
    }

    /// Counts `n` requests under `key` at once (a JSON-RPC batch): all or none.
    pub fn check_n(&self, key: IpAddr, n: u32) -> Result<(), Limited> {
        if self.checks.fetch_add(1, Ordering::Relaxed) % RETAIN_EVERY == RETAIN_EVERY - 1 {
            self.limiter.retain_recent();
            self.limiter.shrink_to_fit();
        }
        let Some(n) = NonZeroU32::new(n) else {
            return Ok(());
        };
        match self.limiter.check_key_n(&key, n) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(not_until)) => Err(Limited {
                retry_after: not_until.wait_time_from(self.limiter.clock().now()),
            }),
            // More than the whole burst: it never fits; a full window is the honest wait.
            Err(_) => Err(Limited {
                retry_after: self.window,
            }),
        }
    }

    /// Keys held now (tests and diagnostics).
    pub fn keys(&self) -> usize {
        self.limiter.len()
    }
}

/// The rate-limit key of a client address: IPv4 as is (an IPv4-mapped IPv6 address is its
/// IPv4 address), IPv6 reduced to its /64 prefix, since one subscriber usually holds a whole
/// /64 and could otherwise take a fresh key per request.
pub fn client_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let bits = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(bits.into())
        }
        v4 => v4,
    }
}

/// `gateway.trustedProxies`: the peers (addresses or CIDR blocks) whose `Forwarded` and
/// `X-Forwarded-For` headers name the client.
#[derive(Debug, Clone, Default)]
pub struct TrustedProxies(Vec<IpNet>);

impl TrustedProxies {
    /// Parses the configured entries (`config::parse_trusted_proxies`, which validation uses
    /// too); the error names the entry that is neither an address nor a CIDR block.
    pub fn parse(entries: &[String]) -> Result<Self, String> {
        crate::config::parse_trusted_proxies(entries).map(Self)
    }

    fn trusts(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.0.iter().any(|net| net.contains(&ip))
    }

    /// The client address of a request from TCP peer `peer`. Only when the peer is a trusted
    /// proxy are the forwarding headers read (`Forwarded` when present, else
    /// `X-Forwarded-For`): walking from the right (the hop nearest to us), the first address
    /// that is not itself a trusted proxy is the client. An entry that is not an address
    /// (`unknown`, an obfuscated name) stops the walk at the last proxy seen: nothing left of
    /// it can be believed.
    pub fn client_ip(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        if self.0.is_empty() || !self.trusts(peer) {
            return peer;
        }
        let forwarded = header_values(headers, &http::header::FORWARDED);
        let hops: Vec<Option<IpAddr>> = if !forwarded.is_empty() {
            forwarded.iter().flat_map(|v| forwarded_for(v)).collect()
        } else {
            header_values(headers, "x-forwarded-for")
                .iter()
                .flat_map(|v| v.split(','))
                .map(parse_node)
                .collect()
        };
        let mut client = peer;
        for hop in hops.into_iter().rev() {
            match hop {
                Some(ip) => {
                    client = ip;
                    if !self.trusts(ip) {
                        break;
                    }
                }
                None => break,
            }
        }
        client.to_canonical()
    }
}

fn header_values<K: http::header::AsHeaderName>(headers: &HeaderMap, name: K) -> Vec<&str> {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect()
}

/// The `for=` node of each element of one `Forwarded` header value (RFC 7239 section 4); an
/// element without `for=` is a hop we cannot place, like `unknown`.
fn forwarded_for(value: &str) -> Vec<Option<IpAddr>> {
    value
        .split(',')
        .map(|element| {
            element.split(';').find_map(|pair| {
                let (name, v) = pair.split_once('=')?;
                name.trim()
                    .eq_ignore_ascii_case("for")
                    .then(|| parse_node(v))
            })?
        })
        .collect()
}

/// An RFC 7239 node or an X-Forwarded-For entry: `1.2.3.4`, `1.2.3.4:80`, `"[2001:db8::1]:80"`,
/// `2001:db8::1`; anything else (`unknown`, `_hidden`) is None.
fn parse_node(raw: &str) -> Option<IpAddr> {
    let s = raw.trim().trim_matches('"').trim();
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Some(rest) = s.strip_prefix('[') {
        let (inside, _) = rest.split_once(']')?;
        return inside.parse::<std::net::Ipv6Addr>().ok().map(IpAddr::V6);
    }
    s.parse::<std::net::SocketAddr>().ok().map(|a| a.ip())
}

/// Why a body could not be read.
#[derive(Debug, PartialEq, Eq)]
pub enum BodyError {
    /// More than the limit was sent (or announced in Content-Length).
    TooLarge,
    /// The client did not finish sending in time.
    Timeout,
    /// The connection failed mid-body.
    Io,
}

/// Reads a body under the gateway's limits (`httpBodyLimitBytes`, `bodyReadTimeoutMs`).
pub async fn read_gateway_body(
    req: &poem::Request,
    body: poem::Body,
    g: &crate::config::GatewayConfig,
) -> Result<Bytes, BodyError> {
    read_body(
        req,
        body,
        g.http_body_limit_bytes,
        Duration::from_millis(g.body_read_timeout_ms),
    )
    .await
}

/// Reads a request body, refusing it as soon as more than `limit` bytes have arrived (or are
/// announced), and giving up after `deadline`.
pub async fn read_body(
    req: &poem::Request,
    body: poem::Body,
    limit: u64,
    deadline: Duration,
) -> Result<Bytes, BodyError> {
    let announced = req
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if announced.is_some_and(|n| n > limit) {
        return Err(BodyError::TooLarge);
    }
    let read = async move {
        let mut stream = std::pin::pin!(body.into_bytes_stream());
        let mut buf = BytesMut::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|_| BodyError::Io)?;
            if (buf.len() + chunk.len()) as u64 > limit {
                return Err(BodyError::TooLarge);
            }
            buf.extend_from_slice(&chunk);
        }
        Ok(buf.freeze())
    };
    tokio::time::timeout(deadline, read)
        .await
        .unwrap_or(Err(BodyError::Timeout))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn proxies(list: &[&str]) -> TrustedProxies {
        TrustedProxies::parse(&list.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn ipv6_addresses_are_grouped_by_64() {
        assert_eq!(
            client_key(ip("2001:db8:1:2:aaaa::1")),
            client_key(ip("2001:db8:1:2:ffff:1:2:3"))
        );
        assert_eq!(client_key(ip("2001:db8:1:2:aaaa::1")), ip("2001:db8:1:2::"));
        assert_ne!(
            client_key(ip("2001:db8:1:2::1")),
            client_key(ip("2001:db8:1:3::1"))
        );
        assert_eq!(client_key(ip("203.0.113.7")), ip("203.0.113.7"));
        assert_ne!(client_key(ip("203.0.113.7")), client_key(ip("203.0.113.8")));
        assert_eq!(client_key(ip("::ffff:203.0.113.7")), ip("203.0.113.7"));
    }

    #[test]
    fn one_64_shares_one_budget_at_the_limit_and_one_past_it() {
        let rl = RateLimiter::new(Duration::from_secs(600), 3, TrustedProxies::default());
        let none = HeaderMap::new();
        for i in 1..=3u16 {
            let peer = IpAddr::V6(std::net::Ipv6Addr::new(0x2001, 0xdb8, 0, 1, i, 0, 0, 1));
            assert!(rl.check(rl.key(peer, &none)).is_ok(), "request {i}");
        }
        let fourth = ip("2001:db8:0:1:ffff::9");
        let refused = rl.check(rl.key(fourth, &none)).err().unwrap();
        assert!(refused.retry_after > Duration::ZERO);
        assert!(refused.retry_after <= Duration::from_secs(600));
        assert!(
            rl.check(rl.key(ip("2001:db8:0:2::1"), &none)).is_ok(),
            "another /64"
        );
        assert_eq!(rl.keys(), 2);
    }

    #[test]
    fn a_batch_is_counted_whole_or_refused_whole() {
        let rl = RateLimiter::new(Duration::from_secs(600), 5, TrustedProxies::default());
        let k = ip("192.0.2.1");
        assert!(rl.check(k).is_ok());
        assert!(
            rl.check_n(k, 5).is_err(),
            "1 + 5 > 5: refused, nothing counted"
        );
        assert!(rl.check_n(k, 4).is_ok(), "1 + 4 = 5 fits");
        assert!(rl.check(k).is_err());
        assert!(rl.check_n(k, 6).is_err(), "more than the burst never fits");
        assert!(rl.check_n(k, 0).is_ok());
    }

    #[test]
    fn forwarding_headers_are_read_only_from_trusted_peers() {
        let p = proxies(&["10.0.0.0/8", "192.0.2.9"]);
        let spoof = headers(&[("x-forwarded-for", "198.51.100.1")]);
        assert_eq!(p.client_ip(ip("203.0.113.5"), &spoof), ip("203.0.113.5"));
        assert_eq!(p.client_ip(ip("10.1.2.3"), &spoof), ip("198.51.100.1"));
        assert_eq!(p.client_ip(ip("192.0.2.9"), &spoof), ip("198.51.100.1"));
        // Nothing configured: never read.
        assert_eq!(
            TrustedProxies::default().client_ip(ip("10.1.2.3"), &spoof),
            ip("10.1.2.3")
        );
    }

    #[test]
    fn the_client_is_the_right_most_address_that_is_not_a_proxy() {
        let p = proxies(&["10.0.0.0/8"]);
        let peer = ip("10.0.0.1");
        // A client-supplied left part is ignored: the right-most untrusted hop wins.
        let xff = headers(&[("x-forwarded-for", "1.1.1.1, 198.51.100.2, 10.0.0.7")]);
        assert_eq!(p.client_ip(peer, &xff), ip("198.51.100.2"));
        let two_lines = headers(&[
            ("x-forwarded-for", "1.1.1.1"),
            ("x-forwarded-for", "198.51.100.3"),
        ]);
        assert_eq!(p.client_ip(peer, &two_lines), ip("198.51.100.3"));
        // Forwarded wins over X-Forwarded-For; quoted IPv6 with a port; parameters in any case.
        let fwd = headers(&[
            (
                "forwarded",
                r#"for=192.0.2.60;proto=http, For="[2001:db8:cafe::17]:4711""#,
            ),
            ("x-forwarded-for", "198.51.100.4"),
        ]);
        assert_eq!(p.client_ip(peer, &fwd), ip("2001:db8:cafe::17"));
        let with_port = headers(&[("forwarded", "for=192.0.2.43:8080;by=10.0.0.1")]);
        assert_eq!(p.client_ip(peer, &with_port), ip("192.0.2.43"));
        // An unknown hop stops the walk at the last proxy.
        let unknown = headers(&[("forwarded", "for=192.0.2.1, for=unknown, for=10.0.0.8")]);
        assert_eq!(p.client_ip(peer, &unknown), ip("10.0.0.8"));
        // Every hop a proxy: the left-most one.
        let all = headers(&[("x-forwarded-for", "10.9.9.9, 10.0.0.8")]);
        assert_eq!(p.client_ip(peer, &all), ip("10.9.9.9"));
        // No header: the peer.
        assert_eq!(p.client_ip(peer, &HeaderMap::new()), peer);
        // Garbage: the peer.
        let junk = headers(&[("x-forwarded-for", "not-an-ip")]);
        assert_eq!(p.client_ip(peer, &junk), peer);
    }

    #[test]
    fn trusted_proxies_parse_addresses_and_blocks_and_name_a_bad_entry() {
        let p = proxies(&["127.0.0.1", "::1", "10.0.0.0/8", "fd00::/8"]);
        assert!(p.trusts(ip("127.0.0.1")));
        assert!(p.trusts(ip("::ffff:10.2.3.4")));
        assert!(p.trusts(ip("fd12::1")));
        assert!(!p.trusts(ip("127.0.0.2")));
        let err = TrustedProxies::parse(&["10.0.0.0/8".into(), "proxy.local".into()]).unwrap_err();
        assert!(err.contains("'proxy.local'"), "{err}");
        assert!(TrustedProxies::parse(&["10.0.0.0/33".into()]).is_err());
    }

    #[test]
    fn idle_keys_are_dropped_so_memory_stays_bounded() {
        let rl = RateLimiter::new(Duration::from_millis(1), 1, TrustedProxies::default());
        for i in 0..(RETAIN_EVERY - 1) {
            let _ = rl.check(IpAddr::V4((0x0a00_0000 + i).into()));
        }
        assert!(rl.keys() > 1000);
        std::thread::sleep(Duration::from_millis(5));
        let _ = rl.check(ip("192.0.2.1"));
        assert!(rl.keys() <= 1, "{} keys left", rl.keys());
    }
}
