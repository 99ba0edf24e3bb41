//! The errors of a URL check or a fetch: one typed enum whose messages name the URL and, for a
//! refusal, the address, its class and the key that would open it.

use std::time::Duration;

use super::addr::Class;

/// Why a URL was refused or a fetch failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NetError {
    #[error("{url:?} is not a URL: {reason}")]
    InvalidUrl { url: String, reason: String },
    #[error("{url}: the scheme must be http or https, got {scheme}")]
    Scheme { url: String, scheme: String },
    #[error("{url}: a URL with user information (user@host) is refused")]
    Userinfo { url: String },
    #[error("{url}: {address} is a {class} address{}", hint(*class))]
    Refused {
        url: String,
        /// The address (or the host name, for `localhost`) refused.
        address: String,
        class: Class,
    },
    #[error("{url}: {host} does not resolve ({reason})")]
    Resolve {
        url: String,
        host: String,
        reason: String,
    },
    #[error("{url}: more than {max} redirects")]
    TooManyRedirects { url: String, max: u32 },
    #[error("{url}: the answer is larger than {max} bytes")]
    TooLarge { url: String, max: u64 },
    #[error("{url}: the fetch took longer than {after:?}")]
    Timeout { url: String, after: Duration },
    #[error("{url}: HTTP {status}")]
    Http { url: String, status: u16 },
    #[error("{url}: {reason}")]
    Io { url: String, reason: String },
}

/// The `net` key that opens a class, for the refusal message.
fn hint(class: Class) -> &'static str {
    match class {
        Class::Loopback => " (net.allowLoopback or net.allowCidrs opens it)",
        Class::Private | Class::Cgnat | Class::LinkLocal => {
            " (net.allowPrivate or net.allowCidrs opens it)"
        }
        Class::Metadata => " (never reachable)",
        Class::Unspecified => "",
        Class::Public | Class::Multicast | Class::Reserved | Class::Documentation => {
            " (net.allowCidrs opens it)"
        }
    }
}
