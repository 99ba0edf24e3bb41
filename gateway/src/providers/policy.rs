//! What `providers.create` / `providers.update` may set, as opposed to the configuration
//! file (which may name anything): `apiKeyEnv` only from an allow-list (the variables the
//! file's providers name plus `providerPolicy.apiKeyEnvAllowlist`), and a `baseUrl` that
//! follows the URL policy of the design (http/https, no user information; loopback, private,
//! link-local addresses refused unless the configuration allows them, metadata and unspecified
//! ones always; IPv6 spellings of IPv4 addresses judged by the IPv4 address; the literal host
//! and every address it resolves to are checked). The classifier, the URL check and the
//! resolver are `net`'s (`docs/net.md`): this module only adds the key allow-list and the
//! messages naming `providerPolicy`.
//!
//! Why: an admin token is not the machine's owner. Without the allow-list, a provider created
//! through the API could name any secret in the gateway's environment as its key and send it
//! to a URL of the caller's choosing; without the URL policy, the gateway's network position
//! (cloud metadata, internal services) would be reachable through `models.test` and turns.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use crate::config::provider_policy::ProviderPolicyConfig;
use crate::net::{Class, NetError, NetPolicy, SystemLookup};

/// The policy in force for one engine: the configured allowances and the allow-list.
#[derive(Debug, Clone, Default)]
pub struct ApiPolicy {
    /// `providerPolicy.apiKeyEnvAllowlist`: may be named with any base URL the policy allows.
    allowed_env: BTreeSet<String>,
    /// Variables the configuration file's providers name, each bound to the base URLs the
    /// file sends it to (None: the type's own endpoint): a key stays with its endpoint.
    bound_env: BTreeMap<String, BTreeSet<Option<String>>>,
    /// The address rules (`allowLoopbackBaseUrl`, `allowPrivateBaseUrl`) on the gateway's
    /// one classifier.
    net: NetPolicy,
}

impl ApiPolicy {
    pub fn new(c: &ProviderPolicyConfig) -> Self {
        Self {
            allowed_env: c.api_key_env_allowlist.iter().cloned().collect(),
            bound_env: BTreeMap::new(),
            net: NetPolicy::addresses(c.allow_loopback_base_url, c.allow_private_base_url),
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

    /// Refuses a `baseUrl` outside the URL policy: its scheme, user information, its literal
    /// host (or a `localhost` name), and every address the host resolves to.
    pub async fn check_base_url(&self, raw: &str) -> Result<(), String> {
        let refuse = |why: String| format!("'config.baseUrl' is refused: {why}");
        match self.net.check(raw, &SystemLookup).await {
            Ok(_) => Ok(()),
            Err(NetError::Refused {
                url,
                address,
                class,
            }) => {
                let host = url::Url::parse(&url)
                    .ok()
                    .and_then(|u| u.host_str().map(str::to_owned))
                    .unwrap_or(url);
                Err(refuse(format!(
                    "{host} reaches {address}, a {class} address{}",
                    allowance(class)
                )))
            }
            Err(NetError::InvalidUrl { reason, .. }) => {
                Err(refuse(format!("not a URL ({reason})")))
            }
            Err(e) => Err(refuse(e.to_string())),
        }
    }

    /// The address rules, for the connection-time guard of providers set through the API.
    pub fn net(&self) -> &NetPolicy {
        &self.net
    }

    /// Why `ip` is refused (its class), or None when it may be reached.
    pub fn refused(&self, ip: IpAddr) -> Option<Class> {
        self.net.refused(ip)
    }
}

/// The configuration key that would allow an address class, for the refusal message.
fn allowance(class: Class) -> &'static str {
    match class {
        Class::Loopback => " (providerPolicy.allowLoopbackBaseUrl allows it)",
        Class::Private | Class::Cgnat | Class::LinkLocal => {
            " (providerPolicy.allowPrivateBaseUrl allows it)"
        }
        _ => "",
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
    fn allowances_open_only_their_classes() {
        let closed = policy(false, false);
        let loopback = policy(true, false);
        let private = policy(false, true);
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(closed.refused(ip("127.0.0.1")), Some(Class::Loopback));
        assert_eq!(loopback.refused(ip("127.0.0.1")), None);
        assert_eq!(loopback.refused(ip("::ffff:127.0.0.1")), None);
        assert_eq!(loopback.refused(ip("10.0.0.1")), Some(Class::Private));
        assert_eq!(private.refused(ip("10.0.0.1")), None);
        assert_eq!(private.refused(ip("100.64.0.1")), None);
        assert_eq!(private.refused(ip("fe80::1")), None);
        assert_eq!(private.refused(ip("127.0.0.1")), Some(Class::Loopback));
        assert_eq!(closed.refused(ip("::ffff:10.0.0.1")), Some(Class::Private));
        for p in [&closed, &loopback, &private, &policy(true, true)] {
            assert_eq!(p.refused(ip("169.254.169.254")), Some(Class::Metadata));
            assert_eq!(
                p.refused(ip("::ffff:169.254.169.254")),
                Some(Class::Metadata)
            );
            assert_eq!(p.refused(ip("64:ff9b::a9fe:a9fe")), Some(Class::Metadata));
            // An IPv6 spelling of a public IPv4 address is judged by that address.
            assert_eq!(p.refused(ip("::ffff:8.8.8.8")), None);
            assert_eq!(p.refused(ip("0.0.0.0")), Some(Class::Unspecified));
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
            "http://user@8.8.8.8/",
            "http://2130706433/",
            "http://localhost./",
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
