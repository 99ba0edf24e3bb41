//! What `providers.create` / `providers.update` may set, as opposed to the configuration
//! file (which may name anything): `apiKeyEnv` only from an allow-list (the variables the
//! file's providers name plus `providerPolicy.apiKeyEnvAllowlist`), and a `baseUrl` that
//! follows the URL policy of the design (http/https; loopback, private, link-local, metadata
//! and IPv4-mapped addresses refused unless the configuration allows them; the literal host
//! and every address it resolves to are checked).
//!
//! Why: an admin token is not the machine's owner. Without the allow-list, a provider created
//! through the API could name any secret in the gateway's environment as its key and send it
//! to a URL of the caller's choosing; without the URL policy, the gateway's network position
//! (cloud metadata, internal services) would be reachable through `models.test` and turns.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use crate::config::provider_policy::ProviderPolicyConfig;

/// How long resolving a `baseUrl`'s host may take.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

/// The policy in force for one engine: the configured allowances and the allow-list.
#[derive(Debug, Clone, Default)]
pub struct ApiPolicy {
    /// `providerPolicy.apiKeyEnvAllowlist`: may be named with any base URL the policy allows.
    allowed_env: BTreeSet<String>,
    /// Variables the configuration file's providers name, each bound to the base URLs the
    /// file sends it to (None: the type's own endpoint): a key stays with its endpoint.
    bound_env: BTreeMap<String, BTreeSet<Option<String>>>,
    allow_loopback: bool,
    allow_private: bool,
}

impl ApiPolicy {
    pub fn new(c: &ProviderPolicyConfig) -> Self {
        Self {
            allowed_env: c.api_key_env_allowlist.iter().cloned().collect(),
            bound_env: BTreeMap::new(),
            allow_loopback: c.allow_loopback_base_url,
            allow_private: c.allow_private_base_url,
        }
    }

    /// Binds a variable a provider of the configuration file names to the base URL it is
    /// sent to there (None: the provider type's own endpoint).
    pub fn bind_env(&mut self, name: &str, base_url: Option<&str>) {
        self.bound_env
            .entry(name.to_owned())
            .or_default()
            .insert(base_url.map(str::to_owned));
    }

    /// Refuses an `apiKeyEnv` the configuration does not allow with this base URL (None: the
    /// type's own endpoint): a variable of the allow-list goes anywhere the URL policy allows;
    /// one the file's providers name goes only where the file sends it. The message names the
    /// member; it does not list the allowed names, which are the operator's business.
    pub fn check_key_env(&self, name: &str, base_url: Option<&str>) -> Result<(), String> {
        if self.allowed_env.contains(name) {
            return Ok(());
        }
        match self.bound_env.get(name) {
            Some(urls) if urls.contains(&base_url.map(str::to_owned)) => Ok(()),
            Some(_) => Err(format!(
                "'config.apiKeyEnv': the variable {name:?} is bound to the endpoint the \
                 configuration file sends it to; it may not be sent to another base URL \
                 through the API (providerPolicy.apiKeyEnvAllowlist lifts this)"
            )),
            None => Err(format!(
                "'config.apiKeyEnv': the variable {name:?} may not be named through the API; \
                 the configuration file's providers or providerPolicy.apiKeyEnvAllowlist must list it"
            )),
        }
    }

    /// Refuses a `baseUrl` outside the URL policy: its scheme, its literal host, and every
    /// address the host resolves to.
    pub async fn check_base_url(&self, raw: &str) -> Result<(), String> {
        let refuse = |why: String| format!("'config.baseUrl' is refused: {why}");
        let url = url::Url::parse(raw.trim()).map_err(|e| refuse(format!("not a URL ({e})")))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(refuse(format!(
                "the scheme must be http or https, got {}",
                url.scheme()
            )));
        }
        let port = url.port_or_known_default().unwrap_or(443);
        let addresses: Vec<IpAddr> = match url.host() {
            None => return Err(refuse("it has no host".to_owned())),
            Some(url::Host::Ipv4(ip)) => vec![IpAddr::V4(ip)],
            Some(url::Host::Ipv6(ip)) => vec![IpAddr::V6(ip)],
            Some(url::Host::Domain(name)) => {
                let lookup = tokio::net::lookup_host((name, port));
                let found = tokio::time::timeout(RESOLVE_TIMEOUT, lookup)
                    .await
                    .map_err(|_| refuse(format!("{name} did not resolve in time")))?
                    .map_err(|e| refuse(format!("{name} does not resolve ({e})")))?;
                let found: Vec<IpAddr> = found.map(|a| a.ip()).collect();
                if found.is_empty() {
                    return Err(refuse(format!("{name} resolves to no address")));
                }
                found
            }
        };
        for ip in addresses {
            if let Some(class) = self.refused(ip) {
                return Err(refuse(format!(
                    "{} reaches {ip}, a {class} address{}",
                    url.host_str().unwrap_or_default(),
                    allowance(class)
                )));
            }
        }
        Ok(())
    }

    /// Why `ip` is refused, or None when it may be reached.
    pub fn refused(&self, ip: IpAddr) -> Option<&'static str> {
        let class = classify(ip)?;
        let allowed = match class {
            Class::Loopback => self.allow_loopback,
            Class::Private | Class::LinkLocal => self.allow_private,
            Class::Mapped(inner) => match classify_v4(inner) {
                Some(Class::Loopback) => self.allow_loopback,
                Some(Class::Private | Class::LinkLocal) => self.allow_private,
                _ => false,
            },
            Class::Metadata | Class::Unspecified | Class::Multicast => false,
        };
        (!allowed).then(|| class.name())
    }
}

/// The configuration key that would allow an address class, for the refusal message.
fn allowance(class: &str) -> &'static str {
    match class {
        "loopback" => " (providerPolicy.allowLoopbackBaseUrl allows it)",
        "private" | "link-local" => " (providerPolicy.allowPrivateBaseUrl allows it)",
        _ => "",
    }
}

/// Address classes the policy cares about; public addresses have none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Loopback,
    /// RFC 1918, shared address space (100.64/10), IPv6 unique local (fc00::/7).
    Private,
    LinkLocal,
    /// Cloud instance metadata endpoints: never allowed.
    Metadata,
    Unspecified,
    Multicast,
    /// An IPv4 address inside IPv6 (`::ffff:a.b.c.d`, NAT64 `64:ff9b::/96`): allowed only
    /// when the address it carries is of an allowed class.
    Mapped(Ipv4Addr),
}

impl Class {
    fn name(self) -> &'static str {
        match self {
            Class::Loopback => "loopback",
            Class::Private => "private",
            Class::LinkLocal => "link-local",
            Class::Metadata => "metadata",
            Class::Unspecified => "unspecified",
            Class::Multicast => "multicast or broadcast",
            Class::Mapped(_) => "IPv4-mapped",
        }
    }
}

fn classify(ip: IpAddr) -> Option<Class> {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

fn classify_v4(ip: Ipv4Addr) -> Option<Class> {
    let [a, b, ..] = ip.octets();
    if ip == Ipv4Addr::new(169, 254, 169, 254) || ip == Ipv4Addr::new(100, 100, 100, 200) {
        Some(Class::Metadata)
    } else if ip.is_loopback() {
        Some(Class::Loopback)
    } else if ip.is_private() || (a == 100 && (64..128).contains(&b)) {
        Some(Class::Private)
    } else if ip.is_link_local() {
        Some(Class::LinkLocal)
    } else if a == 0 {
        Some(Class::Unspecified)
    } else if ip.is_multicast() || ip.is_broadcast() || a >= 240 {
        Some(Class::Multicast)
    } else {
        None
    }
}

fn classify_v6(ip: Ipv6Addr) -> Option<Class> {
    let seg = ip.segments();
    if let Some(v4) = ip.to_ipv4_mapped() {
        return Some(Class::Mapped(v4));
    }
    if seg[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        let [a, b] = seg[6].to_be_bytes();
        let [c, d] = seg[7].to_be_bytes();
        return Some(Class::Mapped(Ipv4Addr::new(a, b, c, d)));
    }
    if ip == Ipv6Addr::new(0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0x0254) {
        Some(Class::Metadata)
    } else if ip.is_loopback() {
        Some(Class::Loopback)
    } else if ip.is_unspecified() {
        Some(Class::Unspecified)
    } else if (seg[0] & 0xfe00) == 0xfc00 {
        Some(Class::Private)
    } else if (seg[0] & 0xffc0) == 0xfe80 {
        Some(Class::LinkLocal)
    } else if ip.is_multicast() {
        Some(Class::Multicast)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::config::provider_policy::{valid_env_name, validate};

    fn policy(loopback: bool, private: bool) -> ApiPolicy {
        ApiPolicy::new(&ProviderPolicyConfig {
            api_key_env_allowlist: vec!["EXTRA_KEY".into()],
            allow_loopback_base_url: loopback,
            allow_private_base_url: private,
        })
    }

    #[test]
    fn address_classes_at_their_edges() {
        let cases: &[(&str, Option<&str>)] = &[
            ("127.0.0.1", Some("loopback")),
            ("127.255.255.255", Some("loopback")),
            ("128.0.0.1", None),
            ("10.0.0.0", Some("private")),
            ("9.255.255.255", None),
            ("11.0.0.0", None),
            ("172.16.0.0", Some("private")),
            ("172.31.255.255", Some("private")),
            ("172.15.255.255", None),
            ("172.32.0.0", None),
            ("192.168.1.1", Some("private")),
            ("100.64.0.0", Some("private")),
            ("100.127.255.255", Some("private")),
            ("100.63.255.255", None),
            ("100.128.0.0", None),
            ("169.254.0.1", Some("link-local")),
            ("169.254.169.254", Some("metadata")),
            ("100.100.100.200", Some("metadata")),
            ("0.0.0.0", Some("unspecified")),
            ("255.255.255.255", Some("multicast or broadcast")),
            ("224.0.0.1", Some("multicast or broadcast")),
            ("8.8.8.8", None),
            ("::1", Some("loopback")),
            ("::", Some("unspecified")),
            ("fc00::1", Some("private")),
            ("fdff:ffff::1", Some("private")),
            ("fe80::1", Some("link-local")),
            ("febf::1", Some("link-local")),
            ("fec0::1", None),
            ("fd00:ec2::254", Some("metadata")),
            ("::ffff:127.0.0.1", Some("IPv4-mapped")),
            ("::ffff:8.8.8.8", Some("IPv4-mapped")),
            ("64:ff9b::a9fe:a9fe", Some("IPv4-mapped")),
            ("2606:4700::1111", None),
        ];
        for (text, expected) in cases {
            let ip: IpAddr = text.parse().unwrap();
            assert_eq!(classify(ip).map(Class::name), *expected, "{text}");
        }
    }

    #[test]
    fn allowances_open_only_their_classes() {
        let closed = policy(false, false);
        let loopback = policy(true, false);
        let private = policy(false, true);
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(closed.refused(ip("127.0.0.1")), Some("loopback"));
        assert_eq!(loopback.refused(ip("127.0.0.1")), None);
        assert_eq!(loopback.refused(ip("::ffff:127.0.0.1")), None);
        assert_eq!(loopback.refused(ip("10.0.0.1")), Some("private"));
        assert_eq!(private.refused(ip("10.0.0.1")), None);
        assert_eq!(private.refused(ip("fe80::1")), None);
        assert_eq!(private.refused(ip("127.0.0.1")), Some("loopback"));
        for p in [&closed, &loopback, &private, &policy(true, true)] {
            assert_eq!(p.refused(ip("169.254.169.254")), Some("metadata"));
            assert_eq!(p.refused(ip("::ffff:169.254.169.254")), Some("IPv4-mapped"));
            assert_eq!(p.refused(ip("::ffff:8.8.8.8")), Some("IPv4-mapped"));
            assert_eq!(p.refused(ip("0.0.0.0")), Some("unspecified"));
            assert_eq!(p.refused(ip("8.8.8.8")), None);
        }
    }

    #[tokio::test]
    async fn urls_are_checked_by_scheme_literal_host_and_resolved_address() {
        let closed = policy(false, false);
        for bad in [
            "ftp://example.com/",
            "file:///etc/passwd",
            "not a url",
            "http://127.0.0.1:11434/v1",
            "http://[::1]/v1",
            "http://localhost:1/v1",
            "http://169.254.169.254/latest",
            "http://[::ffff:7f00:1]/",
            "http://0.0.0.0/",
        ] {
            let err = closed.check_base_url(bad).await.unwrap_err();
            assert!(
                err.starts_with("'config.baseUrl' is refused"),
                "{bad}: {err}"
            );
        }
        let err = closed
            .check_base_url("http://localhost:1/v1")
            .await
            .unwrap_err();
        assert!(err.contains("allowLoopbackBaseUrl"), "{err}");
        let open = policy(true, false);
        open.check_base_url("http://127.0.0.1:11434/v1")
            .await
            .unwrap();
        open.check_base_url("http://localhost:1/v1").await.unwrap();
        assert!(open.check_base_url("http://10.1.2.3/v1").await.is_err());
        closed.check_base_url("https://8.8.8.8/v1").await.unwrap();
    }

    #[test]
    fn key_variables_and_their_names() {
        let mut p = policy(false, false);
        assert!(p
            .check_key_env("EXTRA_KEY", Some("https://x.example/"))
            .is_ok());
        let err = p.check_key_env("AWS_SECRET_ACCESS_KEY", None).unwrap_err();
        assert!(err.starts_with("'config.apiKeyEnv'"), "{err}");
        p.bind_env("OPENAI_API_KEY", None);
        assert!(p.check_key_env("OPENAI_API_KEY", None).is_ok());
        assert!(p.check_key_env("openai_api_key", None).is_err());
        // A file's key stays with the file's endpoint.
        let err = p
            .check_key_env("OPENAI_API_KEY", Some("http://127.0.0.1:9/"))
            .unwrap_err();
        assert!(err.contains("bound"), "{err}");
        p.bind_env("OPENAI_API_KEY", Some("http://127.0.0.1:9/"));
        assert!(p
            .check_key_env("OPENAI_API_KEY", Some("http://127.0.0.1:9/"))
            .is_ok());
        for good in ["A", "_X", "OPENAI_API_KEY", "k1"] {
            assert!(valid_env_name(good), "{good}");
        }
        for bad in ["", "1A", "A-B", "A B", "A=B"] {
            assert!(!valid_env_name(bad), "{bad}");
        }
        let c = ProviderPolicyConfig {
            api_key_env_allowlist: vec!["OK".into(), "NOT OK".into()],
            ..ProviderPolicyConfig::default()
        };
        assert!(validate(&c)
            .unwrap_err()
            .starts_with("providerPolicy.apiKeyEnvAllowlist[1]"));
    }
}
