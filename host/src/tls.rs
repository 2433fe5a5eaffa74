//! TLS for the daemon's listeners: rustls (ring provider), TLS 1.2 and 1.3,
//! HTTP/2 and HTTP/1.1 offered by ALPN.

use std::path::Path;
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::rustls::crypto::ring;

/// Loads a PEM certificate chain and key and builds the acceptor. Any
/// problem is a start-up error naming the file.
pub fn acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| format!("PLIMSOLL_TLS_CERT {}: {e}", cert.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("PLIMSOLL_TLS_CERT {}: {e}", cert.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "PLIMSOLL_TLS_CERT {}: no certificate",
            cert.display()
        ));
    }
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| format!("PLIMSOLL_TLS_KEY {}: {e}", key.display()))?;
    let mut config = ServerConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| format!("TLS: the certificate and key do not fit together: {e}"))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}
