//! `NetPolicy`: which addresses may be reached, built from the `net` section (or, for the
//! providers, from `providerPolicy`'s two allowances), and the URL check every outbound fetch
//! starts with: http or https, no user information, the host parsed by the `url` crate (which
//! turns `2130706433`, `0x7f000001`, `017700000001` and `127.1` into 127.0.0.1), `localhost`
//! names judged loopback before any lookup, then every address the host resolves to.

use std::net::IpAddr;
use std::time::Duration;

use crate::config::net::NetConfig;

use super::addr::{classify, embedded_v4, Class};
use super::error::NetError;
use super::resolve::{Lookup, LOOKUP_TIMEOUT};

/// The policy in force: the allowances and the limits of one fetch.
#[derive(Debug, Clone)]
pub struct NetPolicy {
    allow_loopback: bool,
    allow_private: bool,
    allow_cidrs: Vec<ipnet::IpNet>,
    /// Redirects one fetch follows.
    pub max_redirects: u32,
    /// Largest answer body one fetch reads.
    pub max_bytes: u64,
    /// Longest one fetch may take, everything included.
    pub timeout: Duration,
}

impl Default for NetPolicy {
    fn default() -> Self {
        Self::new(&NetConfig::default())
    }
}

/// A URL that passed the checks that need no lookup.
#[derive(Debug, Clone)]
pub struct Target {
    pub url: url::Url,
    /// The host's address when the URL names one literally (no lookup needed).
    pub literal: Option<IpAddr>,
}

impl NetPolicy {
    pub fn new(c: &NetConfig) -> Self {
        Self {
            allow_loopback: c.allow_loopback,
            allow_private: c.allow_private,
            allow_cidrs: c.allow_cidrs.clone(),
            max_redirects: c.max_redirects,
            max_bytes: c.max_bytes,
            timeout: Duration::from_millis(c.timeout_ms),
        }
    }

    /// The address rules alone, with the default limits (the providers' `providerPolicy`).
    pub fn addresses(allow_loopback: bool, allow_private: bool) -> Self {
        Self {
            allow_loopback,
            allow_private,
            ..Self::default()
        }
    }

    /// The class that refuses `ip`, or None when it may be reached. Metadata and unspecified
    /// addresses are refused whatever the configuration says; `allowCidrs` opens any other
    /// class for the ranges it names (an IPv6 spelling of an IPv4 address is looked up under
    /// both).
    pub fn refused(&self, ip: IpAddr) -> Option<Class> {
        let class = classify(ip);
        let allowed = match class {
            Class::Public => return None,
            Class::Metadata | Class::Unspecified => return Some(class),
            Class::Loopback => self.allow_loopback,
            Class::Private | Class::Cgnat | Class::LinkLocal => self.allow_private,
            Class::Multicast | Class::Reserved | Class::Documentation => false,
        };
        (!allowed && !self.in_cidrs(ip)).then_some(class)
    }

    fn in_cidrs(&self, ip: IpAddr) -> bool {
        let inner = match ip {
            IpAddr::V6(v6) => embedded_v4(v6).map(IpAddr::V4),
            IpAddr::V4(_) => None,
        };
        self.allow_cidrs
            .iter()
            .any(|net| net.contains(&ip) || inner.is_some_and(|v4| net.contains(&v4)))
    }

    /// Whether a loopback address is reachable at all (a name like `localhost` is refused
    /// before any lookup when it is not).
    fn loopback_reachable(&self) -> bool {
        self.allow_loopback
            || [
                IpAddr::from([127, 0, 0, 1]),
                IpAddr::from([0, 0, 0, 0, 0, 0, 0, 1]),
            ]
            .into_iter()
            .any(|ip| self.refused(ip).is_none())
    }

    /// The checks that need no lookup: the URL parses, its scheme is http or https, it carries
    /// no user information, it has a host, and a literal address or a `localhost` name is not
    /// refused.
    pub fn check_url(&self, raw: &str) -> Result<Target, NetError> {
        let url = url::Url::parse(raw.trim()).map_err(|e| NetError::InvalidUrl {
            url: raw.to_owned(),
            reason: e.to_string(),
        })?;
        let shown = || url.as_str().to_owned();
        if !matches!(url.scheme(), "http" | "https") {
            return Err(NetError::Scheme {
                url: shown(),
                scheme: url.scheme().to_owned(),
            });
        }
        if !url.username().is_empty() || url.password().is_some() {
            // Never echo the credentials.
            let mut bare = url.clone();
            let _ = bare.set_username("");
            let _ = bare.set_password(None);
            return Err(NetError::Userinfo {
                url: bare.as_str().to_owned(),
            });
        }
        let literal = match url.host() {
            None => {
                return Err(NetError::InvalidUrl {
                    url: shown(),
                    reason: "it has no host".to_owned(),
                })
            }
            Some(url::Host::Ipv4(ip)) => Some(IpAddr::V4(ip)),
            Some(url::Host::Ipv6(ip)) => Some(IpAddr::V6(ip)),
            Some(url::Host::Domain(name)) => {
                if is_localhost(name) && !self.loopback_reachable() {
                    return Err(NetError::Refused {
                        url: shown(),
                        address: name.to_owned(),
                        class: Class::Loopback,
                    });
                }
                None
            }
        };
        if let Some(ip) = literal {
            if let Some(class) = self.refused(ip) {
                return Err(NetError::Refused {
                    url: shown(),
                    address: ip.to_string(),
                    class,
                });
            }
        }
        Ok(Target { url, literal })
    }

    /// Every address `target`'s host may be reached at, each one checked: a literal address
    /// as it is, a name through `lookup` (under [`LOOKUP_TIMEOUT`]). One refused address
    /// refuses the URL: an answer that mixes public and internal addresses is not trusted.
    pub async fn vet(&self, target: &Target, lookup: &dyn Lookup) -> Result<Vec<IpAddr>, NetError> {
        let url = &target.url;
        if let Some(ip) = target.literal {
            return Ok(vec![ip]);
        }
        let host = url.host_str().unwrap_or_default();
        let failed = |reason: String| NetError::Resolve {
            url: url.as_str().to_owned(),
            host: host.to_owned(),
            reason,
        };
        let found = tokio::time::timeout(LOOKUP_TIMEOUT, lookup.lookup(host))
            .await
            .map_err(|_| failed(format!("no answer in {LOOKUP_TIMEOUT:?}")))?
            .map_err(|e| failed(e.to_string()))?;
        if found.is_empty() {
            return Err(failed("no address".to_owned()));
        }
        for ip in &found {
            if let Some(class) = self.refused(*ip) {
                return Err(NetError::Refused {
                    url: url.as_str().to_owned(),
                    address: ip.to_string(),
                    class,
                });
            }
        }
        Ok(found)
    }

    /// [`check_url`](Self::check_url) then [`vet`](Self::vet).
    pub async fn check(&self, raw: &str, lookup: &dyn Lookup) -> Result<Vec<IpAddr>, NetError> {
        let target = self.check_url(raw)?;
        self.vet(&target, lookup).await
    }
}

/// `localhost`, a name under it, with or without the root's trailing dot (RFC 6761: these are
/// loopback whatever a resolver says).
pub fn is_localhost(name: &str) -> bool {
    let name = name.strip_suffix('.').unwrap_or(name);
    name.eq_ignore_ascii_case("localhost")
        || name
            .len()
            .checked_sub(".localhost".len())
            .and_then(|cut| name.get(cut..))
            .is_some_and(|tail| tail.eq_ignore_ascii_case(".localhost"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn policy(c: NetConfig) -> NetPolicy {
        NetPolicy::new(&c)
    }

    /// The `url` crate does the normalising: these are all 127.0.0.1 by the time the policy
    /// looks, and a bad spelling is not a URL at all (nothing is parsed by hand here).
    #[test]
    fn the_url_crate_normalises_ipv4_spellings() {
        let open = policy(NetConfig {
            allow_loopback: true,
            ..NetConfig::default()
        });
        for host in [
            "2130706433",
            "0x7f000001",
            "017700000001",
            "127.1",
            "127.0.1",
            "0x7f.0.0.1",
            "0177.0.0.01",
            "127.0.0.1.",
        ] {
            let t = open.check_url(&format!("http://{host}/")).unwrap();
            assert_eq!(t.literal, Some(IpAddr::from([127, 0, 0, 1])), "{host}");
            assert_eq!(t.url.host_str(), Some("127.0.0.1"), "{host}");
        }
        for bad in [
            "http://4294967296/",
            "http://127.0.0.256/",
            "http://1.2.3.4.5/",
        ] {
            assert!(
                matches!(open.check_url(bad), Err(NetError::InvalidUrl { .. })),
                "{bad}"
            );
        }
        let t = open.check_url("http://[::ffff:127.0.0.1]/").unwrap();
        assert_eq!(t.url.host_str(), Some("[::ffff:7f00:1]"));
    }

    #[test]
    fn literal_hosts_and_localhost_names_are_judged_before_any_lookup() {
        let closed = NetPolicy::default();
        for url in [
            "http://127.0.0.1/",
            "http://[::1]/",
            "http://[::ffff:127.0.0.1]/",
            "http://[::127.0.0.1]/",
            "http://[64:ff9b::7f00:1]/",
            "http://[2002:7f00:1::]/",
            "http://localhost/",
            "http://localhost./",
            "http://LocalHost:8080/",
            "http://x.y.localhost/",
        ] {
            match closed.check_url(url) {
                Err(NetError::Refused { class, .. }) => assert_eq!(class, Class::Loopback, "{url}"),
                other => panic!("{url}: {other:?}"),
            }
        }
        for url in ["http://0.0.0.0/", "http://[::]/", "http://0/"] {
            assert!(matches!(
                closed.check_url(url),
                Err(NetError::Refused {
                    class: Class::Unspecified,
                    ..
                })
            ));
        }
        assert!(closed.check_url("http://localhost.example.com/").is_ok());
        assert!(closed.check_url("https://8.8.8.8/").is_ok());
        let err = closed.check_url("http://10.0.0.1/").unwrap_err();
        assert!(err.to_string().contains("net.allowPrivate"), "{err}");
        let err = closed.check_url("http://169.254.169.254/").unwrap_err();
        assert!(err.to_string().contains("cloud metadata"), "{err}");
    }

    #[test]
    fn allowances_and_ranges() {
        let private = policy(NetConfig {
            allow_private: true,
            ..NetConfig::default()
        });
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        for open in [
            "10.1.2.3",
            "172.16.0.1",
            "192.168.0.1",
            "100.64.1.1",
            "169.254.1.1",
            "fd12::1",
            "fe80::1",
            "::ffff:10.0.0.1",
        ] {
            assert_eq!(private.refused(ip(open)), None, "{open}");
        }
        for shut in [
            "127.0.0.1",
            "169.254.169.254",
            "169.254.170.2",
            "fd00:ec2::254",
            "224.0.0.1",
            "192.0.2.1",
        ] {
            assert!(private.refused(ip(shut)).is_some(), "{shut}");
        }
        let ranges = policy(NetConfig {
            allow_cidrs: vec![
                "127.0.0.0/8".parse().unwrap(),
                "10.9.0.0/16".parse().unwrap(),
                "169.254.0.0/16".parse().unwrap(),
            ],
            ..NetConfig::default()
        });
        assert_eq!(ranges.refused(ip("127.9.9.9")), None);
        assert_eq!(ranges.refused(ip("::ffff:127.0.0.1")), None);
        assert_eq!(ranges.refused(ip("10.9.1.1")), None);
        assert_eq!(ranges.refused(ip("10.8.1.1")), Some(Class::Private));
        assert_eq!(ranges.refused(ip("::1")), Some(Class::Loopback));
        assert_eq!(ranges.refused(ip("169.254.1.1")), None);
        assert_eq!(ranges.refused(ip("169.254.169.254")), Some(Class::Metadata));
        assert_eq!(
            ranges.refused(ip("::ffff:169.254.169.254")),
            Some(Class::Metadata)
        );
    }

    #[test]
    fn localhost_names() {
        for yes in [
            "localhost",
            "localhost.",
            "LOCALHOST",
            "a.localhost",
            "a.b.localhost.",
        ] {
            assert!(is_localhost(yes), "{yes}");
        }
        for no in [
            "localhost.com",
            "mylocalhost",
            "localhost..",
            "",
            "xlocalhost",
            "localhost.example",
        ] {
            assert!(!is_localhost(no), "{no}");
        }
    }
}
