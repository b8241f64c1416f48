//! TLS handshake failures that no retry can fix, recognised in any error chain (feature
//! `tls`). A backend turns them into [`LockError::Config`](crate::LockError::Config) with
//! a hint naming its own options.

use std::error::Error;

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
