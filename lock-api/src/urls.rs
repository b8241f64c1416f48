//! Lock URLs: [`LockUrl`], which decodes a URL once for every backend (host lists
//! included, which `url::Url` rejects), secret redaction, numeric options, and the check
//! that an option is a known one.

use std::fmt;
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

/// Hides the password of a URL that may not parse: everything between the first `:`
/// after the scheme and the last `@` becomes `***` (without a scheme, everything before
/// the last `@`). Where [`redact_url`] finds URLs inside a message and stops at a space
/// or a quote, this reads the whole text as one URL, so a password holding `/`, `?`,
/// `#`, a space or a quote is hidden too; an `@` in a path or query may hide more than a
/// password, never less.
///
/// ```
/// use tenure_api::urls::redact_unparsed;
/// assert_eq!(redact_unparsed("etcd://root:pa'ss@h?x=0"), "etcd://root:***@h?x=0");
/// assert_eq!(redact_unparsed("root:s3cret@h"), "***@h");
/// assert_eq!(redact_unparsed("zk://h/app"), "zk://h/app");
/// ```
pub fn redact_unparsed(text: &str) -> String {
    let Some(at) = text.rfind('@') else {
        return text.to_string();
    };
    let after = &text[at + 1..];
    let is_scheme = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
    };
    match text[..at].split_once("://") {
        Some((scheme, info)) if is_scheme(scheme) => match info.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{after}"),
            None => text.to_string(),
        },
        _ => format!("***@{after}"),
    }
}

/// Percent-encodes every byte but ASCII letters, digits and `-._~` (RFC 3986's
/// unreserved characters): the inverse of [`percent_decode`](crate::admin::percent_decode)
/// for any text, safe in any part of a URL.
pub fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
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

/// Parses `h1:p1,h2,[::1]:p3` (ports default to `default_port`; the same host syntax as
/// [`LockUrl`]). An empty entry, an unclosed bracket, a bad host or port is
/// [`LockError::Config`].
pub fn parse_host_list(list: &str, default_port: u16) -> Result<Vec<HostPort>, LockError> {
    list.split(',')
        .map(|entry| parse_host(entry, default_port))
        .collect::<Result<_, _>>()
        .map_err(|why| LockError::Config(format!("bad host list {list:?}: {why}")))
}

/// Parses one `host[:port]` or `[v6][:port]`: a host name (ASCII letters, digits, `.`,
/// `-`, `_`), an IPv4 address or a bracketed IPv6 address, and a port in 1..=65535.
fn parse_host(entry: &str, default_port: u16) -> Result<HostPort, String> {
    let entry = entry.trim();
    // Quotes the host only: a password holding an unescaped `/` or `?` ends the authority
    // early, and its tail lands where a port would be.
    let shown = entry.split_once(':').map_or(entry, |(host, _)| host);
    let bad = |why: &str| format!("host {shown:?}: {why}");
    let (host, port) = if let Some(v6) = entry.strip_prefix('[') {
        let (host, after) = v6.split_once(']').ok_or_else(|| bad("unclosed '['"))?;
        if host.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(bad("not an IPv6 address"));
        }
        let port = match after {
            "" => None,
            after => Some(
                after
                    .strip_prefix(':')
                    .ok_or_else(|| bad("junk after ']'"))?,
            ),
        };
        (host, port)
    } else {
        let (host, port) = match entry.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (entry, None),
        };
        let valid = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_');
        if host.is_empty() {
            return Err(bad("empty host"));
        }
        if !host.chars().all(valid) {
            return Err(bad("bad host name"));
        }
        (host, port)
    };
    let port = match port {
        None => default_port,
        Some(text) => text
            .parse::<u16>()
            .ok()
            .filter(|port| *port != 0)
            .ok_or_else(|| bad("the port must be a number in 1..=65535"))?,
    };
    Ok(HostPort {
        host: host.to_string(),
        port,
    })
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

/// Reads query options with each alias as the name it stands for (`aliases`: `(alias,
/// name)` pairs such as `("command_timeout_ms", "request_timeout_ms")`): one concept has
/// one name across backends, and the older names keep working. An option given twice,
/// under any of its names, is an error saying so.
///
/// ```
/// use tenure_api::urls::dealias;
/// let aliases = [("op_timeout_ms", "request_timeout_ms")];
/// let read = dealias([("op_timeout_ms", "5"), ("prefix", "p")], &aliases).unwrap();
/// assert_eq!(read, [("request_timeout_ms", "5"), ("prefix", "p")]);
/// assert!(dealias([("op_timeout_ms", "5"), ("request_timeout_ms", "5")], &aliases).is_err());
/// ```
pub fn dealias<'a>(
    pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
    aliases: &[(&str, &'a str)],
) -> Result<Vec<(&'a str, &'a str)>, String> {
    let mut read: Vec<(&'a str, &'a str, &'a str)> = Vec::new();
    for (given, value) in pairs {
        let name = aliases
            .iter()
            .find(|(alias, _)| *alias == given)
            .map_or(given, |(_, name)| *name);
        if let Some((_, first, _)) = read.iter().find(|(seen, _, _)| *seen == name) {
            return Err(match *first == given {
                true => format!("option {name} is given twice"),
                false => format!("option {name} is given twice (as {first} and as {given})"),
            });
        }
        read.push((name, given, value));
    }
    Ok(read
        .into_iter()
        .map(|(name, _, value)| (name, value))
        .collect())
}

/// The old names in `aliases`, for listing them among the known options.
pub fn alias_names<'a>(aliases: &[(&'a str, &str)]) -> Vec<&'a str> {
    aliases.iter().map(|(alias, _)| *alias).collect()
}

/// Checks that `name` is a plain SQL identifier: `[A-Za-z_][A-Za-z0-9_]*`, at most `max`
/// bytes (a table, schema or database name a backend always quotes in SQL, so a bad
/// name is a typed error, never SQL injection). Anything else is [`LockError::Config`].
///
/// ```
/// use tenure_api::urls::validate_ident;
/// assert!(validate_ident("table", "tenure_locks", 64).is_ok());
/// assert!(validate_ident("table", "locks; DROP TABLE x", 64).is_err());
/// assert!(validate_ident("table", "a", 0).is_err());
/// ```
pub fn validate_ident(what: &str, name: &str, max: usize) -> Result<(), LockError> {
    let mut chars = name.chars();
    let plain = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !plain {
        return Err(LockError::Config(format!(
            "{what} name {name:?} is not a plain identifier ([A-Za-z_][A-Za-z0-9_]*)"
        )));
    }
    if name.len() > max {
        return Err(LockError::Config(format!(
            "{what} name {name:?} is {} bytes long; the limit is {max}",
            name.len()
        )));
    }
    Ok(())
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

/// A lock URL decoded once, the same way for every backend:
/// `scheme://[user[:password]@]host[:port][,host[:port]…][/path][?name=value&…]`.
///
/// User, password, path and option values are percent-decoded; hosts are names (ASCII
/// letters, digits, `.`, `-`, `_`), IPv4 addresses or bracketed IPv6 addresses, with
/// ports in 1..=65535. A fragment, an empty host, a bad escape or an option given twice
/// is [`LockError::Config`] naming the URL with its password hidden. What the path and
/// each option mean is the backend's to say, in its `config.rs`: it reads them from here
/// and reports anything it does not know with [`unknown_option`](Self::unknown_option).
///
/// ```
/// use tenure_api::urls::LockUrl;
/// let url = LockUrl::parse("etcds://u:p%40ss@h1,[::1]:23/app?lease=session", "etcd", &["etcd", "etcds"], 2379)?;
/// assert_eq!(url.scheme(), "etcds");
/// assert_eq!((url.user(), url.password()), (Some("u"), Some("p@ss")));
/// assert_eq!(url.hosts().iter().map(ToString::to_string).collect::<Vec<_>>(), ["h1:2379", "[::1]:23"]);
/// assert_eq!(url.path(), "app");
/// assert_eq!(url.options().collect::<Vec<_>>(), [("lease", "session")]);
/// assert!(!format!("{url:?}").contains("p@ss"));
/// # Ok::<(), tenure_api::LockError>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct LockUrl {
    what: &'static str,
    redacted: String,
    scheme: &'static str,
    user: Option<String>,
    password: Option<String>,
    hosts: Vec<HostPort>,
    path: String,
    options: Vec<(String, String)>,
}

impl LockUrl {
    /// Decodes `text`, whose scheme must be one of `schemes` (any case); `what` names the
    /// backend in errors (`"etcd"`, `"ZooKeeper"`) and hosts without a port get
    /// `default_port`.
    pub fn parse(
        text: &str,
        what: &'static str,
        schemes: &[&'static str],
        default_port: u16,
    ) -> Result<Self, LockError> {
        let redacted = redact_unparsed(text);
        let bad = |why: String| LockError::Config(format!("bad {what} URL {redacted}: {why}"));
        let expected = || {
            schemes
                .iter()
                .map(|s| format!("{s}://"))
                .collect::<Vec<_>>()
                .join(" or ")
        };
        let (scheme, rest) = text
            .split_once("://")
            .ok_or_else(|| bad(format!("it must start with {}", expected())))?;
        let scheme = schemes
            .iter()
            .copied()
            .find(|s| s.eq_ignore_ascii_case(scheme))
            .ok_or_else(|| bad(format!("it must start with {}", expected())))?;
        let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (userinfo, host_list) = match authority.rfind('@') {
            Some(at) => (Some(&authority[..at]), &authority[at + 1..]),
            None => (None, authority),
        };
        // A `#` in a password is the password's; anywhere else it would start a fragment.
        if [host_list, path, query]
            .iter()
            .any(|part| part.contains('#'))
        {
            return Err(bad("fragments (#…) are not allowed".into()));
        }
        let decode = |part: &str, what: &str| {
            crate::admin::percent_decode(part)
                .ok_or_else(|| bad(format!("bad %-escape in the {what}")))
        };
        let (user, password) = match userinfo {
            None => (None, None),
            Some(info) => {
                let (user, password) = match info.split_once(':') {
                    Some((user, password)) => (user, Some(password)),
                    None => (info, None),
                };
                let user = decode(user, "user name")?;
                if user.is_empty() && password.is_none() {
                    return Err(bad("the user name is empty".into()));
                }
                let password = password.map(|p| decode(p, "password")).transpose()?;
                (Some(user), password)
            }
        };
        let hosts = host_list
            .split(',')
            .map(|entry| parse_host(entry, default_port))
            .collect::<Result<Vec<_>, _>>()
            .map_err(bad)?;
        let path = decode(path, "path")?;
        let mut options: Vec<(String, String)> = Vec::new();
        for pair in query.split('&').filter(|pair| !pair.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let name = decode(name, "option names")?;
            let value = decode(value, &format!("value of option {name}"))?;
            if options.iter().any(|(seen, _)| *seen == name) {
                return Err(bad(format!("option {name} is given twice")));
            }
            options.push((name, value));
        }
        Ok(Self {
            what,
            redacted,
            scheme,
            user,
            password,
            hosts,
            path,
            options,
        })
    }

    /// The scheme, as spelt in the `schemes` given to [`parse`](Self::parse).
    pub fn scheme(&self) -> &'static str {
        self.scheme
    }

    /// The user name, if the URL has credentials: empty only beside a password
    /// (`redis://:password@h`, Redis's default user).
    pub fn user(&self) -> Option<&str> {
        self.user.as_deref()
    }

    /// The password, if the URL has one. Never shown by `Debug` or in errors.
    pub fn password(&self) -> Option<&str> {
        self.password.as_deref()
    }

    /// The hosts, in URL order (at least one).
    pub fn hosts(&self) -> &[HostPort] {
        &self.hosts
    }

    /// The path after the authority's `/`, decoded (`""` when there is none).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The query options, decoded, in URL order; each name once.
    pub fn options(&self) -> impl Iterator<Item = (&str, &str)> {
        self.options.iter().map(|(n, v)| (n.as_str(), v.as_str()))
    }

    /// The query options with `aliases` read as the names they stand for (see
    /// [`dealias`]); an option given under two of its names is [`LockError::Config`].
    pub fn options_aliased<'a>(
        &'a self,
        aliases: &[(&str, &'a str)],
    ) -> Result<Vec<(&'a str, &'a str)>, LockError> {
        dealias(self.options(), aliases).map_err(|why| self.error(why))
    }

    /// A [`LockError::Config`] about this URL: `bad <backend> URL <url>: <why>`, with the
    /// password hidden.
    pub fn error(&self, why: impl fmt::Display) -> LockError {
        LockError::Config(format!("bad {} URL {}: {why}", self.what, self.redacted))
    }

    /// The error for option `name`, which the backend does not know: it lists the known
    /// ones (see [`check_option`]).
    pub fn unknown_option(&self, name: &str, known: &[&[&str]]) -> LockError {
        match check_option(self.scheme, name, known) {
            Err(error) => error,
            Ok(()) => self.error(format!("option {name} is not allowed here")),
        }
    }

    /// Option `name`'s `value` as the path of a TLS file (`ca_file`, `cert_file`,
    /// `key_file`): allowed on a TLS URL only (`tls`; otherwise the error says to use
    /// `tls_scheme`), and never empty.
    pub fn tls_file(
        &self,
        name: &str,
        value: &str,
        tls: bool,
        tls_scheme: &str,
    ) -> Result<std::path::PathBuf, LockError> {
        if !tls {
            return Err(self.error(format!("{name} needs TLS: use {tls_scheme}://")));
        }
        if value.is_empty() {
            return Err(self.error(format!("{name} is empty")));
        }
        Ok(value.into())
    }

    /// Option `name`'s `value` as a number of milliseconds in `range`.
    pub fn millis(
        &self,
        name: &str,
        value: &str,
        range: std::ops::RangeInclusive<u64>,
    ) -> Result<Duration, LockError> {
        parse_millis(name, value, range).map_err(|error| match error {
            LockError::Config(why) => self.error(why),
            other => other,
        })
    }
}

impl fmt::Debug for LockUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("LockUrl").field(&self.redacted).finish()
    }
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
    fn lock_urls_are_decoded_once() {
        let parse = |text| LockUrl::parse(text, "test", &["t", "ts"], 7);
        let url = parse("TS://a%3Ab:p%40ss%3A@h1,h2:8,[::1]/x%2Fy/?n=%26v&flag&m=").unwrap();
        assert_eq!(url.scheme(), "ts");
        assert_eq!((url.user(), url.password()), (Some("a:b"), Some("p@ss:")));
        let hosts: Vec<String> = url.hosts().iter().map(ToString::to_string).collect();
        assert_eq!(hosts, ["h1:7", "h2:8", "[::1]:7"]);
        assert_eq!(url.path(), "x/y/");
        let options: Vec<_> = url.options().collect();
        assert_eq!(options, [("n", "&v"), ("flag", ""), ("m", "")]);
        assert!(!format!("{url:?}").contains("ss"), "{url:?}");
        let url = parse("t://h").unwrap();
        assert_eq!(
            (url.user(), url.path(), url.options().count()),
            (None, "", 0)
        );
        assert_eq!(parse("t://u@h").unwrap().password(), None);
        let error = url.error("why").to_string();
        assert!(error.contains("bad test URL t://h: why"), "{error}");
    }

    #[test]
    fn unparsed_urls_lose_their_passwords() {
        for text in [
            "etcd://root:pa'ss@h?request_timeout_ms=0",
            "etcd://root:pa ss@h/p",
            "etcd://root:pa/ss@h",
            "etcd://root:pa?ss@h",
            "etcd://root:pa#ss@h#x",
            "root:pass@h",
            "x://:pass@a,b,c",
            "u:pass://x@h",
            "u@pass://x@h",
        ] {
            let shown = redact_unparsed(text);
            assert!(
                !shown.contains("ss") && shown.contains("***"),
                "{text}: {shown}"
            );
        }
        assert_eq!(
            redact_unparsed("redis://h:1/0?prefix=a"),
            "redis://h:1/0?prefix=a"
        );
        assert_eq!(redact_unparsed("redis://user@h"), "redis://user@h");
    }

    #[test]
    fn odd_passwords_stay_hidden_and_intact() {
        let parse = |text: &str| LockUrl::parse(text, "test", &["t"], 7);
        for password in ["pa'ss", "pa ss", "pa#ss", "pa\"ss"] {
            let error = parse(&format!("t://u:{password}@h:0"))
                .unwrap_err()
                .to_string();
            assert!(!error.contains(password), "{error}");
            let url = parse(&format!("t://u:{password}@h")).unwrap();
            assert_eq!(url.password(), Some(password));
            assert!(!format!("{url:?}").contains(password), "{url:?}");
        }
    }

    #[test]
    fn percent_encoding_round_trips() {
        for text in ["", "plain-._~", "a b+c%d/e?f#g@h:i", "é€\u{1}"] {
            let encoded = percent_encode(text);
            assert!(encoded
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-._~%".contains(&b)));
            assert_eq!(
                crate::admin::percent_decode(&encoded).as_deref(),
                Some(text)
            );
        }
    }

    #[test]
    fn bad_lock_urls_are_config_errors_without_the_password() {
        let parse = |text| LockUrl::parse(text, "test", &["t"], 7);
        for (bad, says) in [
            ("u:hunter2@h", "must start with t://"),
            ("x://u:hunter2@h", "must start with t://"),
            ("t://u:hunter2@h#f", "fragments"),
            ("t://u:hunter2@h/p#f", "fragments"),
            ("t://u:hunter2/x@h", "the port must be"),
            ("t://u:hunter2?x@h", "the port must be"),
            ("t://u:hunter2@h?a=1&a=2", "option a is given twice"),
            ("t://u:hunter2%zz@h", "bad %-escape in the password"),
            ("t://@h", "user name is empty"),
            ("t://u:hunter2@", "empty host"),
            ("t://u:hunter2@h,,i", "empty host"),
            ("t://u:hunter2@h:0", "1..=65535"),
            ("t://u:hunter2@[::g]:1", "not an IPv6 address"),
            ("t://u:hunter2@h\u{e9}", "bad host name"),
            ("t://u:hunter2@h/%ff", "bad %-escape in the path"),
            (
                "t://u:hunter2@h?a=%",
                "bad %-escape in the value of option a",
            ),
        ] {
            match parse(bad) {
                Err(LockError::Config(msg)) => {
                    assert!(msg.contains(says), "{bad}: {msg}");
                    assert!(!msg.contains("hunter2"), "{bad}: {msg}");
                }
                other => panic!("{bad}: {other:?}"),
            }
        }
        let url = parse("t://u:hunter2@h").unwrap();
        let error = url.millis("x_ms", "0", 1..=5).unwrap_err().to_string();
        assert!(
            error.contains("bad test URL t://u:***@h: option x_ms=0"),
            "{error}"
        );
        let error = url.unknown_option("bogus", &[&["known"]]).to_string();
        assert!(
            error.contains("\"bogus\"") && error.contains("known"),
            "{error}"
        );
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
