//! `file://` URLs: the directory the locks live in.

use std::path::{Path, PathBuf};

use tenure_api::admin::percent_decode;
use tenure_api::urls::{check_option, percent_encode};
use tenure_api::LockError;

/// Where a [`FileLock`](crate::FileLock) keeps its files, read from a `file://` URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileConfig {
    dir: PathBuf,
    prefix: String,
}

impl FileConfig {
    /// Reads `file:///absolute/dir` (or `file://localhost/absolute/dir`; `%XX` escapes
    /// decoded), with one option: `prefix`, the namespace every key is named in. Another
    /// host, a relative path, another option or a fragment is [`LockError::Config`]: a
    /// file lock is local to one host.
    pub fn from_url(url: &str) -> Result<Self, LockError> {
        let bad = |why: &str| LockError::Config(format!("bad file URL {url}: {why}"));
        let rest = url
            .split_once("://")
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("file"))
            .map(|(_, rest)| rest)
            .ok_or_else(|| bad("it must start with file://"))?;
        if rest.contains('#') {
            return Err(bad("fragments (#…) are not allowed"));
        }
        let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
        let mut prefix = None;
        for option in query.split('&').filter(|o| !o.is_empty()) {
            let (name, value) = option.split_once('=').unwrap_or((option, ""));
            if name != "prefix" {
                check_option("file", name, &[&["prefix"]])?;
                return Err(bad(&format!(
                    "option {name} is not allowed: only prefix is"
                )));
            }
            let value = percent_decode(value).ok_or_else(|| bad("bad %-escape in prefix"))?;
            if value.chars().any(char::is_control) {
                return Err(bad("prefix contains a control character"));
            }
            if prefix.replace(value).is_some() {
                return Err(bad("option prefix is given twice"));
            }
        }
        let (host, path) = match rest.find('/') {
            Some(at) => rest.split_at(at),
            None => (rest, ""),
        };
        if !host.is_empty() && !host.eq_ignore_ascii_case("localhost") {
            return Err(bad(&format!(
                "host {host:?}: a file lock is local to this host (file:///dir)"
            )));
        }
        let path = percent_decode(path).ok_or_else(|| bad("bad %-escape in the path"))?;
        if path.is_empty() || path == "/" {
            return Err(bad(
                "give the directory the locks live in (file:///var/lock/tenure)",
            ));
        }
        if path.contains('\0') {
            return Err(bad("the path contains a NUL byte"));
        }
        Ok(Self {
            dir: path.into(),
            prefix: prefix.unwrap_or_default(),
        })
    }

    /// A configuration for the directory `dir`, which must be absolute.
    pub fn in_dir(dir: impl Into<PathBuf>) -> Result<Self, LockError> {
        let dir = dir.into();
        if !dir.is_absolute() {
            return Err(LockError::Config(format!(
                "the lock directory {} is not an absolute path",
                dir.display()
            )));
        }
        Ok(Self {
            dir,
            prefix: String::new(),
        })
    }

    /// The same, every key named in the namespace `prefix` (as the URL's `prefix`).
    pub fn with_prefix(self, prefix: impl Into<String>) -> Self {
        Self {
            prefix: prefix.into(),
            ..self
        }
    }

    /// The namespace every key is named in (`""`: none).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The directory the lock files live in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// This configuration as a URL (`file:///dir`, `?prefix=…` if it has one), its path
    /// `%`-escaped where needed.
    pub fn url(&self) -> String {
        let escaped: String = self
            .dir
            .as_os_str()
            .as_encoded_bytes()
            .iter()
            .copied()
            .map(|b| match b {
                b'/' | b'-' | b'_' | b'.' | b'~' => char::from(b).to_string(),
                b if b.is_ascii_alphanumeric() => char::from(b).to_string(),
                b => format!("%{b:02X}"),
            })
            .collect();
        match self.prefix.as_str() {
            "" => format!("file://{escaped}"),
            prefix => format!("file://{escaped}?prefix={}", percent_encode(prefix)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_url_names_an_absolute_directory_on_this_host() {
        let dir = |url: &str| FileConfig::from_url(url).map(|c| c.dir().to_owned());
        assert_eq!(
            dir("file:///var/lock/tenure").unwrap(),
            Path::new("/var/lock/tenure")
        );
        assert_eq!(
            dir("FILE://localhost/tmp/a%20b").unwrap(),
            Path::new("/tmp/a b")
        );
        for (url, why) in [
            ("file://", "give the directory"),
            ("file:///", "give the directory"),
            ("file://host/tmp", "local to this host"),
            ("file:///tmp?ttl=1", "unknown option \"ttl\""),
            ("file:///tmp?prefix=a&prefix=b", "twice"),
            ("file:///tmp?prefix=%0A", "control character"),
            ("file:///tmp#x", "fragments"),
            ("file:///tmp/%zz", "%-escape"),
            ("file:///tmp/%00", "NUL"),
            ("redis:///tmp", "file://"),
            ("/tmp", "file://"),
        ] {
            let error = dir(url).unwrap_err().to_string();
            assert!(error.contains(why), "{url}: {error}");
        }
    }

    #[test]
    fn its_url_reads_back() {
        let config = FileConfig::in_dir("/tmp/locks dir/ä").unwrap();
        assert_eq!(config.url(), "file:///tmp/locks%20dir/%C3%A4");
        assert_eq!(FileConfig::from_url(&config.url()).unwrap(), config);
        assert!(FileConfig::in_dir("relative").is_err());
        let prefixed = config.with_prefix("billing/ä");
        assert_eq!(FileConfig::from_url(&prefixed.url()).unwrap(), prefixed);
        assert_eq!(prefixed.prefix(), "billing/ä");
    }
}
