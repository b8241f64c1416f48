//! Helpers every backend's URL parser shares: secret redaction, host lists (which
//! `url::Url` rejects), numeric options, and the check that an option is a known one.

use std::time::Duration;

use crate::LockError;

/// Hides the password of every `user:password@` in `text` (URLs with one host or a host
/// list, alone or inside a message), keeping the user name. Never panics.
///
/// ```
/// use tenure_api::urls::redact_url;
/// assert_eq!(redact_url("redis://app:s3cret@h:6379/0"), "redis://app:***@h:6379/0");
/// assert_eq!(redact_url("etcd://root:pw@a:1,b:2/p"), "etcd://root:***@a:1,b:2/p");
/// ```
pub fn redact_url(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("://") {
        let (head, tail) = rest.split_at(start + 3);
        out.push_str(head);
        let end = tail
            .find(['/', '?', '#', ' ', '"', '\'', '\n'])
            .unwrap_or(tail.len());
        let authority = &tail[..end];
        match authority.rfind('@') {
            Some(at) => {
                match authority[..at].split_once(':') {
                    Some((user, _)) => {
                        out.push_str(user);
                        out.push_str(":***");
                    }
                    None => out.push_str(&authority[..at]),
                }
                out.push_str(&authority[at..]);
            }
            None => out.push_str(authority),
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

/// One `host[:port]` of a host list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostPort {
    /// The host name or address (IPv6 without brackets).
    pub host: String,
    /// The port.
    pub port: u16,
}

impl std::fmt::Display for HostPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// Parses `h1:p1,h2,[::1]:p3` (ports default to `default_port`). An empty entry, an
/// unclosed bracket or a bad port is [`LockError::Config`].
pub fn parse_host_list(list: &str, default_port: u16) -> Result<Vec<HostPort>, LockError> {
    let bad = |why: String| LockError::Config(format!("bad host list {list:?}: {why}"));
    list.split(',')
        .map(|entry| {
            let entry = entry.trim();
            let (host, port) = if let Some(v6) = entry.strip_prefix('[') {
                let (host, after) = v6
                    .split_once(']')
                    .ok_or_else(|| bad(format!("unclosed '[' in {entry:?}")))?;
                match after {
                    "" => (host, None),
                    _ => (
                        host,
                        Some(
                            after
                                .strip_prefix(':')
                                .ok_or_else(|| bad(format!("junk after ']' in {entry:?}")))?,
                        ),
                    ),
                }
            } else {
                match entry.split_once(':') {
                    Some((host, port)) => (host, Some(port)),
                    None => (entry, None),
                }
            };
            if host.is_empty()
                || host
                    .chars()
                    .any(|c| c.is_whitespace() || c.is_control() || "@/?#[]".contains(c))
            {
                return Err(bad(format!("bad host {host:?}")));
            }
            let port = match port {
                None => default_port,
                Some(text) => text
                    .parse::<u16>()
                    .ok()
                    .filter(|p| *p > 0)
                    .ok_or_else(|| bad(format!("bad port {text:?}")))?,
            };
            Ok(HostPort {
                host: host.to_string(),
                port,
            })
        })
        .collect()
}

/// Checks that the query option `name` of a `scheme://` URL is one of `known` (tenure's
/// options and those handed on to the client library, in one or more lists). Anything
/// else is [`LockError::Config`] naming it and listing the known ones, so a misspelt
/// option is an error rather than a silently ignored setting. Values are never shown.
///
/// ```
/// use tenure_api::urls::check_option;
/// assert!(check_option("redis", "prefix", &[&["prefix"], &["protocol"]]).is_ok());
/// let err = check_option("redis", "bogus", &[&["prefix"], &["protocol"]]).unwrap_err();
/// assert!(err.to_string().contains("\"bogus\"") && err.to_string().contains("prefix, protocol"));
/// ```
pub fn check_option(scheme: &str, name: &str, known: &[&[&str]]) -> Result<(), LockError> {
    if known.iter().any(|list| list.contains(&name)) {
        return Ok(());
    }
    let listed: Vec<&str> = known.iter().flat_map(|list| list.iter().copied()).collect();
    Err(LockError::Config(format!(
        "unknown option {name:?} in a {scheme}:// URL; the known options are: {}",
        listed.join(", ")
    )))
}

/// Parses a `…_ms` option within `range` (milliseconds) into a duration.
pub fn parse_millis(
    name: &str,
    value: &str,
    range: std::ops::RangeInclusive<u64>,
) -> Result<Duration, LockError> {
    value
        .parse::<u64>()
        .ok()
        .filter(|ms| range.contains(ms))
        .map(Duration::from_millis)
        .ok_or_else(|| {
            LockError::Config(format!(
                "option {name}={value} must be a number of milliseconds in {}..={}",
                range.start(),
                range.end()
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_lists() {
        let hosts = parse_host_list("a:1, b ,[::1]:3,[fe80::1]", 9).unwrap();
        let shown: Vec<String> = hosts.iter().map(ToString::to_string).collect();
        assert_eq!(shown, ["a:1", "b:9", "[::1]:3", "[fe80::1]:9"]);
        for bad in [
            "", "a,,b", "a:0", "a:70000", "a:x", "[::1", "[::1]x", "u@h", "a b",
        ] {
            assert!(
                matches!(parse_host_list(bad, 1), Err(LockError::Config(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn redaction() {
        for url in [
            "redis://user:hunter2@h:6379/0",
            "redlock://:hunter2@a:1,b:2,c:3?prefix=x",
            "see redis://u:hunter2@h and etcd://root:hunter2@a,b/p",
        ] {
            let shown = redact_url(url);
            assert!(
                !shown.contains("hunter2") && shown.contains("***"),
                "{shown}"
            );
        }
        assert_eq!(redact_url("redis://h:1/0"), "redis://h:1/0");
        assert_eq!(redact_url("redis://user@h"), "redis://user@h");
    }

    #[test]
    fn unknown_options_are_named_with_the_known_ones() {
        let known: &[&[&str]] = &[&["prefix", "fence"], &["protocol"]];
        for name in ["prefix", "fence", "protocol"] {
            assert!(check_option("redis", name, known).is_ok(), "{name}");
        }
        for name in ["bogus", "", "Prefix", "prefix "] {
            match check_option("redis", name, known) {
                Err(LockError::Config(msg)) => {
                    assert!(msg.contains(&format!("{name:?}")), "{msg}");
                    assert!(msg.contains("prefix, fence, protocol"), "{msg}");
                    assert!(msg.contains("redis://"), "{msg}");
                }
                other => panic!("{name:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn millis() {
        assert_eq!(
            parse_millis("t", "250", 1..=1000).unwrap(),
            Duration::from_millis(250)
        );
        assert!(parse_millis("t", "0", 1..=1000).is_err());
        assert!(parse_millis("t", "x", 1..=1000).is_err());
    }
}
