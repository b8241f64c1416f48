//! How keys and lock nodes are named in ZooKeeper.
//!
//! A key's directory is one path component: the key with `/`, `%` and every character
//! ZooKeeper refuses in a path percent-encoded (so `jobs/nightly` and `jobs%2Fnightly`
//! cannot collide, and no key can escape the prefix or clash with another key's
//! directory). Lock nodes inside it are named `lock-<owner id hex>-<sequence>`.

use std::fmt::Write as _;

use tenure_api::OwnerId;

/// Name prefix of every lock node.
pub(crate) const LOCK_PREFIX: &str = "lock-";

/// Whether ZooKeeper refuses `c` in a path (`PathUtils.validatePath`, which checks UTF-16
/// code units: it refuses U+D800–U+F8FF, so every character beyond U+FFFF, sent as a
/// surrogate pair, is refused too).
fn forbidden(c: char) -> bool {
    c == '\0'
        || c.is_control()
        || ('\u{e000}'..='\u{f8ff}').contains(&c)
        || ('\u{fff0}'..='\u{ffff}').contains(&c)
        || u32::from(c) > 0xffff
}

/// Checks `path` is an absolute ZooKeeper path other than `/`: no empty, `.` or `..`
/// component, no trailing `/`, no character the server refuses.
pub(crate) fn validate_znode_path(path: &str) -> Result<(), String> {
    let rest = path
        .strip_prefix('/')
        .ok_or_else(|| "must start with '/'".to_string())?;
    if rest.is_empty() {
        return Err("must not be the root".into());
    }
    for component in rest.split('/') {
        match component {
            "" => return Err("empty path component".into()),
            "." | ".." => return Err("relative path component".into()),
            c => {
                if let Some(bad) = c.chars().find(|c| forbidden(*c)) {
                    return Err(format!("character {bad:?} is not allowed"));
                }
            }
        }
    }
    Ok(())
}

/// The single path component holding `key`'s lock nodes.
pub(crate) fn encode_key(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for c in key.chars() {
        if c == '/' || c == '%' || forbidden(c) {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                let _ = write!(out, "%{b:02X}");
            }
        } else {
            out.push(c);
        }
    }
    if out == "." || out == ".." {
        out = out.replace('.', "%2E");
    }
    out
}

/// The name prefix of `owner`'s node; the server appends the sequence number.
pub(crate) fn node_prefix(owner: OwnerId) -> String {
    format!("{LOCK_PREFIX}{owner}-")
}

/// A lock node found in a key's directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LockNode {
    /// The node's name (last path component).
    pub(crate) name: String,
    /// Whose node it is.
    pub(crate) owner: OwnerId,
    /// Its sequence number: the queue position.
    pub(crate) sequence: i64,
}

impl LockNode {
    /// Parses `lock-<32 hex>-<sequence>`, the sequence being what ZooKeeper appends:
    /// `%010d` of the parent's 32-bit `cversion` — negative past 2^31, e.g. `-2147483648`
    /// or `-000000001` — or a longer run of digits. Anything else is not a lock node.
    pub(crate) fn parse(name: &str) -> Option<Self> {
        let rest = name.strip_prefix(LOCK_PREFIX)?;
        let (owner, sequence) = rest.split_once('-')?;
        let digits = sequence.strip_prefix('-').unwrap_or(sequence);
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        Some(Self {
            name: name.to_string(),
            owner: OwnerId::parse(owner).ok()?,
            sequence: sequence.parse().ok()?,
        })
    }
}

/// The lock nodes among `children`, in queue order: the order ZooKeeper assigned their
/// sequences in.
///
/// 32-bit sequences wrap (`2147483647`, `-2147483648`, …, `-000000001`, `0000000000`):
/// they are ordered as unsigned numbers on a circle, starting after the largest gap
/// between neighbours — exact as long as the live nodes of one directory span fewer than
/// 2^31 sequence numbers (their creation and deletion each use one). Sequences beyond
/// 32 bits do not wrap and are ordered as numbers.
pub(crate) fn queue(children: &[String]) -> Vec<LockNode> {
    let mut nodes: Vec<LockNode> = children.iter().filter_map(|c| LockNode::parse(c)).collect();
    let wrapping = |n: &LockNode| i32::try_from(n.sequence).ok().map(|s| s as u32);
    if !nodes.iter().all(|n| wrapping(n).is_some()) {
        nodes.sort_by_key(|n| n.sequence);
        return nodes;
    }
    nodes.sort_by_key(|n| wrapping(n).unwrap_or_default());
    let circle: Vec<u64> = nodes
        .iter()
        .map(|n| u64::from(wrapping(n).unwrap_or_default()))
        .collect();
    if let (Some(&first), Some(&last)) = (circle.first(), circle.last()) {
        // The gap across the wrap point wins ties: no rotation in the usual case.
        let mut largest = (first + (1 << 32) - last, 0);
        for (i, pair) in circle.windows(2).enumerate() {
            if pair[1] - pair[0] > largest.0 {
                largest = (pair[1] - pair[0], i + 1);
            }
        }
        nodes.rotate_left(largest.1);
    }
    nodes
}

/// A key's lock nodes, in queue order, as listed with their directory's `cversion`.
#[derive(Debug)]
pub(crate) struct Listing {
    /// The lock nodes, oldest first.
    pub(crate) nodes: Vec<LockNode>,
    /// Whether a node has lived through 2^31 or more changes of the directory: past
    /// 2^32 its age wraps unseen, so the order of the nodes it has seen is no longer
    /// certain (see `Created::uncertain`).
    pub(crate) ambiguous: bool,
}

/// The lock nodes among `children` in creation order, counted back from `cversion`, the
/// directory's change counter that named each of them: a node's age is the number of
/// changes since its creation, modulo 2^32. Exact while every node has lived through
/// fewer than 2^32 changes; once any has lived through 2^31, the listing is `ambiguous`. Sequences beyond 32
/// bits do not wrap and are ordered as numbers.
pub(crate) fn listing(children: &[String], cversion: i32) -> Listing {
    let mut nodes: Vec<LockNode> = children.iter().filter_map(|c| LockNode::parse(c)).collect();
    let wrapping = |n: &LockNode| i32::try_from(n.sequence).ok().map(|s| s as u32);
    if !nodes.iter().all(|n| wrapping(n).is_some()) {
        nodes.sort_by_key(|n| n.sequence);
        return Listing {
            nodes,
            ambiguous: false,
        };
    }
    let age = |n: &LockNode| (cversion as u32).wrapping_sub(wrapping(n).unwrap_or_default());
    nodes.sort_by_key(|n| std::cmp::Reverse(age(n)));
    let ambiguous = nodes.iter().any(|n| age(n) >= 1 << 31);
    Listing { nodes, ambiguous }
}

/// The owner encoded in a lock node path's last component.
pub(crate) fn owner_of_path(path: &str) -> Option<OwnerId> {
    let name = path.rsplit('/').next()?;
    LockNode::parse(name).map(|n| n.owner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_map_to_one_valid_component_injectively() {
        let keys = [
            "jobs/nightly",
            "jobs%2Fnightly",
            "jobs",
            ".",
            "..",
            "...",
            "a b",
            "ünïcödé/ключ",
            "\u{e000}private",
            "\u{fff0}",
            "emoji 😀",
            "lock-x",
        ];
        let mut seen = std::collections::HashSet::new();
        for key in keys {
            let encoded = encode_key(key);
            assert!(!encoded.contains('/'), "{key:?} -> {encoded:?}");
            validate_znode_path(&format!("/p/{encoded}"))
                .unwrap_or_else(|e| panic!("{key:?} -> {encoded:?}: {e}"));
            assert!(seen.insert(encoded), "collision for {key:?}");
        }
        assert_eq!(encode_key("jobs/nightly"), "jobs%2Fnightly");
        assert_eq!(encode_key(".."), "%2E%2E");
        assert_eq!(encode_key("😀"), "%F0%9F%98%80");
    }

    #[test]
    fn paths_are_validated() {
        for good in ["/a", "/a/b", "/a.b/..c", "/ü"] {
            assert!(validate_znode_path(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "a",
            "/",
            "/a/",
            "//a",
            "/a//b",
            "/./a",
            "/a/..",
            "/a\u{7f}",
            "/\u{e000}",
            "/😀",
        ] {
            assert!(validate_znode_path(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn lock_nodes_parse_and_sort_by_sequence() {
        let a = OwnerId([0xab; 16]);
        let b = OwnerId([0x01; 16]);
        let children = vec![
            format!("{}0000000010", node_prefix(a)),
            "not-a-lock".to_string(),
            format!("{}0000000002", node_prefix(b)),
            format!("{}2147483648000", node_prefix(b)),
            format!("{LOCK_PREFIX}zz-0000000001"),
            format!("{}", node_prefix(a)),
        ];
        let q = queue(&children);
        assert_eq!(
            q.iter().map(|n| (n.owner, n.sequence)).collect::<Vec<_>>(),
            [(b, 2), (a, 10), (b, 2_147_483_648_000)]
        );
        assert_eq!(owner_of_path(&format!("/t/k/{}", q[1].name)), Some(a));
        assert_eq!(owner_of_path("/t/k/other"), None);
    }

    /// Defect: the largest-gap rule put a waiter created 3·10^9 directory changes after
    /// the holder (which still lives) first. Counted back from the directory's
    /// `cversion`, the holder is first, and the listing says its order is ambiguous.
    #[test]
    fn a_node_older_than_2_pow_31_changes_makes_the_order_ambiguous() {
        let (holder, waiter) = (OwnerId([1; 16]), OwnerId([2; 16]));
        let created = |owner, at: u32| format!("{}{:010}", node_prefix(owner), at as i32);
        let children = [created(waiter, 3_000_000_000), created(holder, 0)];
        let listed = listing(&children, 3_000_000_001u32 as i32);
        let order: Vec<OwnerId> = listed.nodes.iter().map(|n| n.owner).collect();
        assert_eq!(order, [holder, waiter]);
        assert!(listed.ambiguous);
        // Young enough: exact and certain, across the wrap too.
        let children = [created(waiter, 5), created(holder, u32::MAX - 5)];
        let listed = listing(&children, 6);
        let order: Vec<OwnerId> = listed.nodes.iter().map(|n| n.owner).collect();
        assert_eq!(order, [holder, waiter]);
        assert!(!listed.ambiguous);
        assert!(!listing(&[created(holder, 7)], 8).ambiguous);
    }

    /// ZooKeeper names a sequential node with `%010d` of the parent's 32-bit `cversion`,
    /// which goes negative past 2^31 (`-2147483648`, then `-2147483647`, …, `-000000001`,
    /// then `0000000000` again). Those nodes are lock nodes too, queued after the ones
    /// before the wrap.
    #[test]
    fn sequences_past_the_32_bit_wrap_parse_and_queue_in_creation_order() {
        let owners: Vec<OwnerId> = (1..=6u8).map(|i| OwnerId([i; 16])).collect();
        let suffixes = [
            "2147483646",
            "2147483647",
            "-2147483648",
            "-2147483647",
            "-000000002",
            "-000000001",
        ];
        let names: Vec<String> = owners
            .iter()
            .zip(suffixes)
            .map(|(o, s)| format!("{}{s}", node_prefix(*o)))
            .collect();
        for (name, s) in names.iter().zip(suffixes) {
            let node = LockNode::parse(name).unwrap_or_else(|| panic!("{name} must parse"));
            assert_eq!(node.sequence, s.parse::<i64>().unwrap());
        }
        let mut shuffled = names.clone();
        shuffled.reverse();
        shuffled.swap(0, 3);
        let q = queue(&shuffled);
        assert_eq!(
            q.iter().map(|n| n.owner).collect::<Vec<_>>(),
            owners,
            "creation order across the wrap"
        );
        // …and across the second wrap (-1 → 0).
        let after = [
            format!("{}-000000001", node_prefix(owners[0])),
            format!("{}0000000000", node_prefix(owners[1])),
            format!("{}0000000001", node_prefix(owners[2])),
        ];
        let q = queue(&[after[2].clone(), after[1].clone(), after[0].clone()]);
        assert_eq!(q.iter().map(|n| n.owner).collect::<Vec<_>>(), owners[..3]);
        // Not what ZooKeeper produces: not lock nodes.
        for bad in ["-", "--1", "+5", "-x", "1-2", ""] {
            assert_eq!(
                LockNode::parse(&format!("{}{bad}", node_prefix(owners[0]))),
                None,
                "{bad:?}"
            );
        }
    }
}
