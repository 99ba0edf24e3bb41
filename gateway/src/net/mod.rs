//! The gateway's one door to the network for URLs it did not choose itself: the address
//! classifier (`addr`), the policy built from the `net` configuration section (`policy`), the
//! pinning resolver every outbound HTTP client resolves through (`resolve`), the TLS settings
//! they share (`tls`), and the fetcher that checks a URL, pins its vetted addresses, follows
//! redirects by hand and caps the answer (`fetch`). Floor 2: it knows the configuration and
//! nothing above it; `providers` builds its clients on it.

pub mod addr;
pub mod error;
pub mod fetch;
pub mod policy;
pub mod resolve;
pub mod tls;

pub use addr::{classify, Class};
pub use error::NetError;
pub use fetch::{Fetcher, Request, Response};
pub use policy::NetPolicy;
pub use resolve::{Lookup, Resolve, SystemLookup};
