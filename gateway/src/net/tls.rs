//! The TLS settings every outbound HTTPS client shares: the webpki roots plus the certificates
//! of the PEM file `SSL_CERT_FILE` names (an internal CA, a TLS-inspecting proxy's CA), HTTP/2
//! or HTTP/1.1 by ALPN, rustls over ring.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

/// Names a PEM file of certificates trusted besides the built-in webpki roots: the variable
/// OpenSSL, curl and Python read.
pub const EXTRA_ROOTS_VAR: &str = "SSL_CERT_FILE";

fn extra_roots_from_env() -> Option<PathBuf> {
    std::env::var_os(EXTRA_ROOTS_VAR)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// The settings built once per process from the environment (the file is read once; a
/// changed file takes a restart).
pub fn shared_tls_config() -> Result<rustls::ClientConfig, String> {
    static SHARED: OnceLock<Result<rustls::ClientConfig, String>> = OnceLock::new();
    SHARED
        .get_or_init(|| tls_config(extra_roots_from_env().as_deref()))
        .clone()
}

/// What is wrong with the file of extra trusted roots the environment names, if it names
/// one: until it is fixed, no HTTPS client can be built.
pub fn extra_roots_problem() -> Option<String> {
    shared_tls_config().err()
}

/// The webpki roots plus every certificate in `extra_roots`. A named file that cannot be read
/// or holds no certificate is an error (a trust setting is never ignored silently).
pub fn tls_config(extra_roots: Option<&Path>) -> Result<rustls::ClientConfig, String> {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(path) = extra_roots {
        let named = || format!("{EXTRA_ROOTS_VAR}={}", path.display());
        let certs = CertificateDer::pem_file_iter(path)
            .map_err(|e| format!("{}: {e}", named()))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("{}: {e}", named()))?;
        if certs.is_empty() {
            return Err(format!("{}: no PEM certificate in the file", named()));
        }
        for cert in certs {
            roots.add(cert).map_err(|e| format!("{}: {e}", named()))?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth())
}
