//! A throwaway certificate authority for servers that require TLS, generated when a test
//! starts (no key is ever committed) and written as PEM files into the server's
//! temporary directory: the CA, a server certificate for `127.0.0.1` and `localhost`, and
//! two client certificates (`tenure`'s and a stranger's), all signed by that CA. [`TestPki::generate`] called twice gives
//! two unrelated CAs: a client given the other one's `ca.pem` must refuse the server.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

use super::{Result, ServerError};

/// The PEM files of one throwaway CA, in a directory the caller owns.
#[derive(Clone, Debug)]
pub struct TestPki {
    dir: PathBuf,
}

impl TestPki {
    /// A new CA, and a server and two client certificates it signs, written to `dir` as
    /// `ca.pem`, `server.pem`, `server.key`, `client.pem`, `client.key`, `stranger.pem` and
    /// `stranger.key` (keys readable by their owner only, as Postgres requires).
    pub fn generate(dir: &Path) -> Result<TestPki> {
        let failed = |e: rcgen::Error| ServerError::Start {
            what: "the test certificate authority".into(),
            detail: e.to_string(),
        };
        std::fs::create_dir_all(dir)?;
        let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(failed)?;
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "tenure throwaway test CA");
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().map_err(failed)?)
            .map_err(failed)?;
        let leaf = |name: &str, usage: ExtendedKeyUsagePurpose| {
            let mut params = CertificateParams::new(vec!["127.0.0.1".into(), "localhost".into()])?;
            params.distinguished_name.push(DnType::CommonName, name);
            params.extended_key_usages = vec![usage];
            let key = KeyPair::generate()?;
            let cert = params.signed_by(&key, &ca)?;
            Ok::<_, rcgen::Error>((cert.pem(), key.serialize_pem()))
        };
        let (server, server_key) =
            leaf("tenure test server", ExtendedKeyUsagePurpose::ServerAuth).map_err(failed)?;
        let (client, client_key) =
            leaf("tenure test client", ExtendedKeyUsagePurpose::ClientAuth).map_err(failed)?;
        let (stranger, stranger_key) =
            leaf("tenure test stranger", ExtendedKeyUsagePurpose::ClientAuth).map_err(failed)?;
        let pki = TestPki {
            dir: dir.to_path_buf(),
        };
        std::fs::write(pki.ca(), ca.pem())?;
        std::fs::write(pki.server_cert(), server)?;
        std::fs::write(pki.client_cert(), client)?;
        std::fs::write(pki.stranger_cert(), stranger)?;
        for (path, key) in [
            (pki.server_key(), server_key),
            (pki.client_key(), client_key),
            (pki.stranger_key(), stranger_key),
        ] {
            write_private(&path, &key)?;
        }
        Ok(pki)
    }

    /// A CA unrelated to any server's, in a temporary directory that lives as long as the
    /// returned guard: what a client that must refuse the server trusts.
    pub fn unrelated() -> Result<(tempfile::TempDir, TestPki)> {
        let dir = tempfile::tempdir()?;
        let pki = TestPki::generate(dir.path())?;
        Ok((dir, pki))
    }

    /// The CA certificate (PEM): what clients trust.
    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// The server's certificate (PEM), for `127.0.0.1` and `localhost`.
    pub fn server_cert(&self) -> PathBuf {
        self.dir.join("server.pem")
    }

    /// The server's private key (PEM, PKCS#8).
    pub fn server_key(&self) -> PathBuf {
        self.dir.join("server.key")
    }

    /// A client certificate (PEM), for servers that require one.
    pub fn client_cert(&self) -> PathBuf {
        self.dir.join("client.pem")
    }

    /// The client certificate's private key (PEM, PKCS#8).
    pub fn client_key(&self) -> PathBuf {
        self.dir.join("client.key")
    }

    /// Another client certificate (PEM), for a client that is not `tenure` (servers that
    /// authenticate clients by certificate tell the two apart).
    pub fn stranger_cert(&self) -> PathBuf {
        self.dir.join("stranger.pem")
    }

    /// The stranger certificate's private key (PEM, PKCS#8).
    pub fn stranger_key(&self) -> PathBuf {
        self.dir.join("stranger.key")
    }
}

/// A throwaway CA and the random passwords of two users of a secured server: `tenure`,
/// who may use the lock objects, and `stranger`, who may not. `Debug` shows neither
/// password.
#[derive(Clone)]
pub struct TestSecrets {
    /// The server's CA and a client certificate it signed.
    pub pki: TestPki,
    /// The password of user `tenure`.
    pub password: String,
    /// The password of user `stranger`.
    pub stranger_password: String,
}

impl TestSecrets {
    /// A new CA in `dir` (see [`TestPki::generate`]) and two random 128-bit passwords.
    pub fn generate(dir: &Path) -> Result<TestSecrets> {
        Ok(TestSecrets {
            pki: TestPki::generate(dir)?,
            password: random_password(),
            stranger_password: random_password(),
        })
    }
}

/// A random 128-bit password, in hex.
pub fn random_password() -> String {
    format!("{:032x}", rand::random::<u128>())
}

impl TestSecrets {
    /// The TLS query options of a `rediss://`, `redlocks://` or `etcds://` URL: trust this
    /// CA, present the client certificate.
    pub fn tls_options(&self) -> String {
        self.tls_options_trusting(&self.pki.ca())
    }

    /// The same, with the [stranger's](TestPki::stranger_cert) client certificate.
    pub fn stranger_tls_options(&self) -> String {
        format!(
            "ca_file={}&cert_file={}&key_file={}",
            self.pki.ca().display(),
            self.pki.stranger_cert().display(),
            self.pki.stranger_key().display()
        )
    }

    /// The same, trusting `ca` instead (e.g. an [unrelated](TestPki::unrelated) one).
    pub fn tls_options_trusting(&self, ca: &Path) -> String {
        format!(
            "ca_file={}&cert_file={}&key_file={}",
            ca.display(),
            self.pki.client_cert().display(),
            self.pki.client_key().display()
        )
    }
}

impl std::fmt::Debug for TestSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestSecrets")
            .field("pki", &self.pki)
            .finish_non_exhaustive()
    }
}

/// Writes a private file (a key, passwords) readable by its owner only.
pub fn write_private(path: &Path, pem: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(pem.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_authorities_are_unrelated_and_keys_are_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let one = TestPki::generate(&dir.path().join("one")).unwrap();
        let two = TestPki::generate(&dir.path().join("two")).unwrap();
        let read = |p: PathBuf| std::fs::read_to_string(p).unwrap();
        assert!(read(one.ca()).starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(read(one.server_key()).contains("PRIVATE KEY-----"));
        assert_ne!(read(one.ca()), read(two.ca()));
        for key in [one.server_key(), one.client_key(), one.stranger_key()] {
            let mode = std::fs::metadata(key).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }
}
