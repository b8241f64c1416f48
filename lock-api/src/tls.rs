//! TLS for backends (feature `tls`): the client's PEM files read and checked, and TLS
//! handshake failures that no retry can fix recognised in any error chain (a backend
//! turns them into [`LockError::Config`] with a hint naming its own options).

use std::error::Error;
use std::path::Path;

use crate::LockError;

/// Makes sure rustls has a process-wide crypto provider before a TLS connection: client
/// libraries ask for the default one, and rustls cannot pick it by itself when the
/// application enables none of its providers, or more than one (a build with both *ring*
/// and aws-lc-rs panics there). With the `rustls-ring` feature (backends turn it on by
/// default), installs *ring*'s if none is installed yet; an application that installed its
/// own keeps it. Without the feature, the application provides one.
pub fn install_crypto_provider() {
    #[cfg(feature = "rustls-ring")]
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race to another installer is fine: a provider is installed either way.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// The PEM contents of a client's TLS files (options `ca_file`, `cert_file`, `key_file`).
#[derive(Clone, Default)]
pub struct PemFiles {
    /// The CA certificates to trust instead of the built-in roots.
    pub ca: Option<Vec<u8>>,
    /// The client certificate (chain) and its private key.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for PemFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PemFiles")
            .field("ca", &self.ca.is_some())
            .field("identity", &self.identity.is_some())
            .finish()
    }
}

/// Reads the TLS files given: each must hold a PEM block of its kind, and `cert_file` and
/// `key_file` go together. A problem is [`LockError::Config`] naming the option and the
/// file (never the file's content), prefixed with `endpoint`.
pub fn read_pem_files(
    endpoint: &str,
    ca_file: Option<&Path>,
    cert_file: Option<&Path>,
    key_file: Option<&Path>,
) -> Result<PemFiles, LockError> {
    let read = |name: &str, path: &Path, marker: &str| {
        let text = std::fs::read(path).map_err(|e| {
            LockError::Config(format!("{endpoint}: {name} {}: {e}", path.display()))
        })?;
        if !text.windows(marker.len()).any(|w| w == marker.as_bytes()) {
            return Err(LockError::Config(format!(
                "{endpoint}: {name} {}: no PEM {marker} block in it",
                path.display()
            )));
        }
        Ok(text)
    };
    let ca = match ca_file {
        Some(path) => Some(read("ca_file", path, "CERTIFICATE-----")?),
        None => None,
    };
    let identity = match (cert_file, key_file) {
        (Some(cert), Some(key)) => Some((
            read("cert_file", cert, "CERTIFICATE-----")?,
            read("key_file", key, "PRIVATE KEY-----")?,
        )),
        (None, None) => None,
        _ => {
            return Err(LockError::Config(format!(
                "{endpoint}: cert_file and key_file go together (a client certificate and its key)"
            )))
        }
    };
    Ok(PemFiles { ca, identity })
}

/// Why a TLS handshake was refused, when retrying cannot help.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TlsRefusal {
    /// The server's certificate is not trusted: another CA signed it, it does not name the
    /// host connected to, it expired, …
    UntrustedServer,
    /// The server refused the client's certificate, or needs one that was not sent.
    ClientCertificate,
    /// The server refused the handshake: no TLS version or cipher suite in common, or
    /// (what TLS 1.2 servers answer) a required client certificate was missing.
    Handshake,
}

/// The refusal somewhere in `error`'s source chain (looking inside `std::io::Error`s,
/// which clients wrap TLS errors in), if any.
pub fn tls_refusal(error: &(dyn Error + 'static)) -> Option<TlsRefusal> {
    use rustls::AlertDescription as Alert;
    let mut next = Some(error);
    while let Some(error) = next {
        if let Some(tls) = error.downcast_ref::<rustls::Error>() {
            return match tls {
                rustls::Error::InvalidCertificate(_) => Some(TlsRefusal::UntrustedServer),
                rustls::Error::AlertReceived(
                    Alert::CertificateRequired
                    | Alert::BadCertificate
                    | Alert::UnknownCA
                    | Alert::CertificateUnknown
                    | Alert::CertificateExpired
                    | Alert::CertificateRevoked
                    | Alert::UnsupportedCertificate
                    | Alert::AccessDenied,
                ) => Some(TlsRefusal::ClientCertificate),
                rustls::Error::AlertReceived(
                    Alert::HandshakeFailure | Alert::ProtocolVersion | Alert::InsufficientSecurity,
                ) => Some(TlsRefusal::Handshake),
                _ => None,
            };
        }
        // `io::Error::source` skips the error it wraps; look at that one first.
        next = match error.downcast_ref::<std::io::Error>() {
            Some(io) => io
                .get_ref()
                .map(|inner| inner as &(dyn Error + 'static))
                .or_else(|| error.source()),
            None => error.source(),
        };
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("connect failed")]
    struct Wrapper(#[source] std::io::Error);

    #[test]
    fn refusals_are_found_inside_io_errors_anywhere_in_the_chain() {
        let untrusted = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let wrapped = Wrapper(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            untrusted,
        ));
        assert_eq!(tls_refusal(&wrapped), Some(TlsRefusal::UntrustedServer));
        let alert = rustls::Error::AlertReceived(rustls::AlertDescription::CertificateRequired);
        assert_eq!(tls_refusal(&alert), Some(TlsRefusal::ClientCertificate));
        let handshake = rustls::Error::AlertReceived(rustls::AlertDescription::HandshakeFailure);
        assert_eq!(tls_refusal(&handshake), Some(TlsRefusal::Handshake));
        // A dropped connection or a refused port is not a TLS refusal: retrying may help.
        let reset = Wrapper(std::io::ErrorKind::ConnectionReset.into());
        assert_eq!(tls_refusal(&reset), None);
        let closed = rustls::Error::AlertReceived(rustls::AlertDescription::CloseNotify);
        assert_eq!(tls_refusal(&closed), None);
    }
}
