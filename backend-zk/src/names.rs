//! How keys and lock nodes are named in ZooKeeper.
//!
//! A key's directory is one path component: the key with `/`, `%` and every character
//! ZooKeeper refuses in a path percent-encoded (so `jobs/nightly` and `jobs%2Fnightly`
//! cannot collide, and no key can escape the prefix or clash with another key's
//! directory). tenure names its lock nodes as the recipe it shares locks with does
//! ([`NodeNames`]), with its owner id where that recipe puts its UUID: Curator's
//! `_c_<owner as UUID>-lock-<sequence>` by default.
//!
//! Every contender in the directory is in the queue, ordered by the sequence ZooKeeper
//! gave it, whoever made it: tenure's nodes in any of its layouts, Curator's and
//! go-zookeeper's `[_c_<uuid>-]lock-<sequence>` (Curator's read-write lock: `__READ__`,
//! `__WRIT__`), kazoo's `<uuid hex>__lock__<sequence>` (`__rlock__`). A node is tenure's
//! own only when its name carries the owner id of the call looking at it; tenure never
//! deletes another's. A child whose name ends in none of these is not a contender (one
//! that merely looks like one, `block-0000000001`, counts: the safe side).

use std::fmt::Write as _;

use tenure_api::OwnerId;

/// How tenure names its lock nodes (`zk://…?node_names=`): as the other recipe that
/// shares its locks does, so that recipe sees tenure's nodes as contenders too.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NodeNames {
    /// `_c_<owner as UUID>-lock-<sequence>`: Curator's `InterProcessMutex` and
    /// go-zookeeper's `Lock`, and kazoo's `Lock` given `extra_lock_patterns=["-lock-"]`.
    #[default]
    Curator,
    /// `<owner hex>__lock__<sequence>`: kazoo's `Lock` as it comes (Curator and
    /// go-zookeeper do not order these). Key directories are then persistent, as kazoo
    /// makes them, and stay when empty.
    Kazoo,
    /// `lock-<owner hex>-<sequence>`: the names of older tenure clients, for a fleet in
    /// which some still run (they see no other layout). Not for a path shared with
    /// Curator (it orders these by the owner's hex) or kazoo (it ignores them).
    Legacy,
}

impl NodeNames {
    /// The values of the `node_names` option, in variant order.
    pub const VALUES: [(&'static str, Self); 3] = [
        ("curator", Self::Curator),
        ("kazoo", Self::Kazoo),
        ("legacy", Self::Legacy),
    ];

    /// The option value naming this layout.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Curator => "curator",
            Self::Kazoo => "kazoo",
            Self::Legacy => "legacy",
        }
    }

    /// Whether a key's directory is persistent, as kazoo makes it (its `Lock` makes its
    /// path once, and fails once the server has removed an emptied container), rather
    /// than a container the server removes once empty, as Curator makes it.
    pub(crate) fn persistent_dirs(self) -> bool {
        self == Self::Kazoo
    }

    /// The name prefix of `owner`'s node; the server appends the sequence number.
    pub fn prefix(self, owner: OwnerId) -> String {
        match self {
            Self::Curator => {
                let hex = owner.to_string();
                let (a, rest) = hex.split_at(8);
                let (b, rest) = rest.split_at(4);
                let (c, rest) = rest.split_at(4);
                let (d, e) = rest.split_at(4);
                format!("{CURATOR_PROTECTED}{a}-{b}-{c}-{d}-{e}{CURATOR_LOCK}")
            }
            Self::Kazoo => format!("{owner}{KAZOO_LOCK}"),
            Self::Legacy => format!("{LEGACY_PREFIX}{owner}-"),
        }
    }

    /// Whether readers' nodes have names in this layout (see
    /// [`reader_prefix`](Self::reader_prefix)).
    pub fn has_readers(self) -> bool {
        self != Self::Legacy
    }

    /// The name prefix of `owner`'s reader's node, which the layout's exclusive locks
    /// order as a contender: `_c_<owner as UUID>-__READ__-lock-` (Curator's
    /// `InterProcessMutex`, go-zookeeper's `Lock` and kazoo's `Lock` with the `-lock-`
    /// pattern read the sequence after the last `lock-`: a bare `__READ__<sequence>`, as
    /// Curator's read-write lock names its readers, is one they do not see, and would be
    /// granted beside), or `<owner hex>-read__lock__` (kazoo's `Lock` waits only for
    /// `__lock__<sequence>`, not for its `ReadLock`'s `__rlock__`). `None` in the legacy
    /// layout: older clients know no readers.
    pub fn reader_prefix(self, owner: OwnerId) -> Option<String> {
        match self {
            Self::Curator => {
                let writer = self.prefix(owner);
                let stem = writer.strip_suffix(CURATOR_LOCK)?;
                Some(format!("{stem}-{CURATOR_READ}{CURATOR_LOCK}"))
            }
            Self::Kazoo => Some(format!("{owner}{KAZOO_READER}{KAZOO_LOCK}")),
            Self::Legacy => None,
        }
    }
}

/// Curator's protected-mode prefix, before the UUID.
const CURATOR_PROTECTED: &str = "_c_";
/// Curator's lock name, between the UUID and the sequence.
const CURATOR_LOCK: &str = "-lock-";
/// kazoo's lock marker, between the UUID hex and the sequence.
const KAZOO_LOCK: &str = "__lock__";
/// Curator's read-lock name, between the UUID's `-` and the sequence (tenure's readers add
/// [`CURATOR_LOCK`] before the sequence, for Curator's mutex to see them).
const CURATOR_READ: &str = "__READ__";
/// kazoo's read-lock marker, between the UUID hex and the sequence.
const KAZOO_READ: &str = "__rlock__";
/// What tenure's readers put between the owner hex and [`KAZOO_LOCK`] in kazoo's layout.
const KAZOO_READER: &str = "-read";
/// Name prefix of tenure's older lock nodes.
const LEGACY_PREFIX: &str = "lock-";

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

/// Where another recipe's node name puts its sequence: after the last of these.
const FOREIGN_MARKERS: [&str; 5] = ["__lock__", "__rlock__", "__READ__", "__WRIT__", "lock-"];

/// The markers of other recipes' readers' nodes, which wait for writers only.
const READER_MARKERS: [&str; 2] = [KAZOO_READ, CURATOR_READ];

/// A lock node found in a key's directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LockNode {
    /// The node's name (last path component).
    pub(crate) name: String,
    /// Whose node it is: the owner id or UUID its name carries, else one derived from
    /// its name.
    pub(crate) owner: OwnerId,
    /// Its sequence number: the queue position.
    pub(crate) sequence: i64,
    /// Named in a layout tenure never uses (no owner id in it): never one of tenure's
    /// own nodes.
    pub(crate) foreign: bool,
    /// A reader's node (tenure's or another recipe's read lock): it shares the key with
    /// the readers beside it, and waits for the writers before it only.
    pub(crate) reader: bool,
}

/// A sequence as ZooKeeper appends it: `%010d` of the parent's 32-bit `cversion` —
/// negative past 2^31, e.g. `-2147483648` or `-000000001` — or a longer run of digits.
fn sequence(text: &str) -> Option<i64> {
    let digits = text.strip_prefix('-').unwrap_or(text);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

impl LockNode {
    /// Parses a node named in one of tenure's layouts ([`NodeNames`]), or another
    /// recipe's contender (see the module docs) whose name ends in the full 10 or more
    /// characters of a sequence. Anything else is not a lock node.
    pub(crate) fn parse(name: &str) -> Option<Self> {
        Self::parse_own(name).or_else(|| Self::parse_foreign(name))
    }

    /// Whether this is `owner`'s own node (never another recipe's, whatever owner id its
    /// name yields).
    pub(crate) fn is_of(&self, owner: OwnerId) -> bool {
        !self.foreign && self.owner == owner
    }

    /// Parses a name in one of tenure's layouts only (which a Curator or kazoo node
    /// also has: it is told from tenure's own by its owner, see [`Self::is_of`]).
    pub(crate) fn parse_own(name: &str) -> Option<Self> {
        let (layout, owner) = if let Some(rest) = name.strip_prefix(CURATOR_PROTECTED) {
            (NodeNames::Curator, rest.get(..36)?.replace('-', ""))
        } else if let Some(rest) = name.strip_prefix(LEGACY_PREFIX) {
            (NodeNames::Legacy, rest.get(..32)?.to_string())
        } else {
            (NodeNames::Kazoo, name.get(..32)?.to_string())
        };
        let owner = OwnerId::parse(&owner).ok()?;
        // Exactly the name tenure writes (lowercase hex, a UUID's dashes where they go,
        // the full 10 or more characters of a sequence): no two names are one owner's.
        let (sequence_text, reader) = match name.strip_prefix(layout.prefix(owner).as_str()) {
            Some(text) => (text, false),
            None => (
                name.strip_prefix(layout.reader_prefix(owner)?.as_str())?,
                true,
            ),
        };
        Some(Self {
            name: name.to_string(),
            owner,
            sequence: sequence(sequence_text).filter(|_| sequence_text.len() >= 10)?,
            foreign: false,
            reader,
        })
    }

    fn parse_foreign(name: &str) -> Option<Self> {
        // A child's name, not a path below it (the holder feed's recursive watch sees
        // those too: a Curator semaphore's `locks/…` nodes are not this lock's queue).
        if name.contains('/') {
            return None;
        }
        FOREIGN_MARKERS.iter().find_map(|marker| {
            let at = name.rfind(marker)?;
            let text = &name[at + marker.len()..];
            let sequence = sequence(text).filter(|_| text.len() >= 10)?;
            Some(Self {
                name: name.to_string(),
                owner: foreign_owner(&name[..at], name),
                sequence,
                foreign: true,
                reader: READER_MARKERS.contains(marker),
            })
        })
    }
}

/// The owner of another recipe's node `name`, which starts with `stem`: the UUID in the
/// stem (Curator's protected `_c_<uuid>-`, kazoo's `<uuid hex>`), else one derived from
/// the whole name.
fn foreign_owner(stem: &str, name: &str) -> OwnerId {
    let hex: String = stem
        .trim_start_matches("_c_")
        .chars()
        .filter(|c| *c != '-')
        .collect();
    OwnerId::parse(&hex).unwrap_or_else(|_| OwnerId::derived(name.as_bytes()))
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

/// The owner encoded in the last component of a path named in one of tenure's layouts
/// (none for a name with no owner id: no lease is ever on one).
pub(crate) fn owner_of_path(path: &str) -> Option<OwnerId> {
    let name = path.rsplit('/').next()?;
    LockNode::parse_own(name).map(|n| n.owner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node_prefix(owner: OwnerId) -> String {
        NodeNames::default().prefix(owner)
    }

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
            "lock-zz-0000000001".to_string(),
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

    /// Readers' nodes are named so that the layout's exclusive locks order them (kazoo's
    /// as its read lock names its own), and told from writers' whoever made them; the
    /// legacy layout names none.
    #[test]
    fn readers_nodes_are_ordered_by_the_layouts_locks_and_told_apart() {
        let ours = OwnerId([0xab; 16]);
        let curator = NodeNames::Curator.reader_prefix(ours).unwrap();
        assert_eq!(
            curator,
            "_c_abababab-abab-abab-abab-abababababab-__READ__-lock-"
        );
        let kazoo = NodeNames::Kazoo.reader_prefix(ours).unwrap();
        assert_eq!(kazoo, format!("{ours}-read__lock__"));
        assert_eq!(NodeNames::Legacy.reader_prefix(ours), None);
        assert!(!NodeNames::Legacy.has_readers() && NodeNames::Kazoo.has_readers());
        for prefix in [&curator, &kazoo] {
            let node = LockNode::parse(&format!("{prefix}0000000007")).unwrap();
            assert!(
                node.reader && node.is_of(ours) && node.sequence == 7,
                "{node:?}"
            );
        }
        let writer = LockNode::parse(&format!("{}0000000008", node_prefix(ours))).unwrap();
        assert!(!writer.reader && writer.is_of(ours));
        let uuid = "3f2a9c1e-5b7d-4e8f-9a0b-1c2d3e4f5a6b";
        for (name, reader) in [
            (format!("_c_{uuid}-__WRIT__0000000009"), false),
            ("__READ__0000000010".to_string(), true),
            // Curator's read-write lock's own reader.
            (format!("_c_{uuid}-__READ__0000000013"), true),
            // What a name with both markers is taken for: a writer (the safe side).
            ("x__READ__-lock-0000000014".to_string(), false),
            (
                "0123456789abcdef0123456789abcdef__rlock__0000000011".to_string(),
                true,
            ),
            (
                "0123456789abcdef0123456789abcdef__lock__0000000012".to_string(),
                false,
            ),
        ] {
            let node = LockNode::parse(&name).unwrap();
            assert_eq!((node.reader, node.is_of(ours)), (reader, false), "{name}");
        }
    }

    /// Other recipes' contenders in a key's directory are queued with tenure's, by the
    /// sequence ZooKeeper gave each: a kazoo or Curator holder is one tenure waits for.
    #[test]
    fn other_recipes_nodes_queue_with_tenures_by_sequence() {
        let ours = OwnerId([0xab; 16]);
        let uuid = "3f2a9c1e-5b7d-4e8f-9a0b-1c2d3e4f5a6b";
        let children = vec![
            format!("{}0000000012", node_prefix(ours)),
            "3f2a9c1e5b7d4e8f9a0b1c2d3e4f5a6b__lock__0000000004".to_string(),
            format!("_c_{uuid}-lock-0000000007"),
            "lock-0000000009".to_string(),
            "__WRIT__0000000010".to_string(),
            "0123456789abcdef0123456789abcdef__rlock__0000000011".to_string(),
            // Not contenders: no sequence, or too short to be ZooKeeper's.
            "leases".to_string(),
            "lock-42".to_string(),
            "x__lock__12".to_string(),
        ];
        let q = listing(&children, 13).nodes;
        let sequences: Vec<i64> = q.iter().map(|n| n.sequence).collect();
        assert_eq!(sequences, [4, 7, 9, 10, 11, 12]);
        let foreign: Vec<bool> = q.iter().map(|n| n.foreign).collect();
        // kazoo's and Curator's names with a UUID are tenure's layouts (their readers'
        // are not: tenure's readers are named for the exclusive locks to see).
        assert_eq!(foreign, [false, false, true, true, true, false]);
        let readers: Vec<bool> = q.iter().map(|n| n.reader).collect();
        assert_eq!(readers, [false, false, false, false, true, false]);
        let kazoo = OwnerId::parse("3f2a9c1e5b7d4e8f9a0b1c2d3e4f5a6b").unwrap();
        assert_eq!(q[0].owner, kazoo, "kazoo's UUID prefix");
        assert_eq!(q[1].owner, kazoo, "Curator's protected UUID");
        assert_ne!(q[2].owner, ours);
        assert_ne!(q[2].owner, q[3].owner, "derived from the whole name");
        assert_eq!(
            q[2].owner,
            LockNode::parse("lock-0000000009").unwrap().owner,
            "the same for the same name"
        );
        assert_eq!(q[5].owner, ours);
        assert!(q[5].is_of(ours) && q[0].is_of(kazoo) && !q[0].is_of(ours));
        assert!(
            !q[2].is_of(q[2].owner),
            "a name with no owner id is never one's own"
        );
        // No lease is on a node whose name has no owner id.
        assert_eq!(owner_of_path(&format!("/t/k/{}", q[2].name)), None);
        assert_eq!(owner_of_path(&format!("/t/k/{}", q[5].name)), Some(ours));
        // Below a child (a recursive watch's event): not a contender of this queue.
        assert_eq!(LockNode::parse("locks/_c_x-lock-0000000003"), None);
        // Negative sequences past the 32-bit wrap, as ZooKeeper formats them.
        for (name, expected) in [
            ("abc__lock__-000000001", -1),
            ("abc__lock__-2147483648", -2_147_483_648),
            ("_c_x-lock--000000002", -2),
        ] {
            assert_eq!(
                LockNode::parse(name).map(|n| n.sequence),
                Some(expected),
                "{name}"
            );
        }
    }

    /// Each layout tenure names its nodes in is parsed back to its owner, as a node of
    /// its own; the others' nodes of the same layout are told from it by their owner.
    #[test]
    fn every_layout_names_the_owner_and_parses_back() {
        let owner = OwnerId::parse("3f2a9c1e5b7d4e8f9a0b1c2d3e4f5a6b").unwrap();
        let expected = [
            "_c_3f2a9c1e-5b7d-4e8f-9a0b-1c2d3e4f5a6b-lock-",
            "3f2a9c1e5b7d4e8f9a0b1c2d3e4f5a6b__lock__",
            "lock-3f2a9c1e5b7d4e8f9a0b1c2d3e4f5a6b-",
        ];
        for ((value, names), prefix) in NodeNames::VALUES.into_iter().zip(expected) {
            assert_eq!(names.as_str(), value);
            assert_eq!(names.prefix(owner), prefix, "{value}");
            let node = LockNode::parse(&format!("{prefix}0000000042")).unwrap();
            assert_eq!((node.owner, node.sequence), (owner, 42), "{value}");
            assert!(
                node.is_of(owner) && !node.is_of(OwnerId([0; 16])),
                "{value}"
            );
            assert_eq!(
                owner_of_path(&format!("/t/k/{prefix}-000000003")),
                Some(owner)
            );
            let stranger = OwnerId::random();
            let theirs = LockNode::parse(&format!("{}0000000001", names.prefix(stranger)));
            assert!(!theirs.unwrap().is_of(owner), "{value}");
        }
        // Almost one of the layouts (dashes elsewhere, upper case, a short hex): a
        // contender, never an owner's node.
        for near in [
            "_c_3f2a9c1e-5b7d-4e8f-9a0b1c2d3e4f5a6b0-lock-0000000001",
            "_c_3f2a9c1e5b7d-4e8f-9a0b-1c2d3e4f5a6b-lock-0000000001",
            "_c_3F2A9C1E-5B7D-4E8F-9A0B-1C2D3E4F5A6B-lock-0000000001",
            "3F2A9C1E5B7D4E8F9A0B1C2D3E4F5A6B__lock__0000000001",
            "3f2a9c1e5b7d4e8f9a0b1c2d3e4f5a6__lock__0000000001",
        ] {
            let node = LockNode::parse(near).unwrap_or_else(|| panic!("{near}: a contender"));
            assert!(node.foreign && !node.is_of(owner), "{near}");
        }
        // `+f` is 0x0f to `from_str_radix`: still not the name of the owner `0f2a…`'s
        // node (nor of any other recipe's).
        let padded = OwnerId::parse("0f2a9c1e5b7d4e8f9a0b1c2d3e4f5a6b").unwrap();
        let plus = LockNode::parse("lock-+f2a9c1e5b7d4e8f9a0b1c2d3e4f5a6b-0000000001");
        assert!(plus.is_none_or(|node| !node.is_of(padded)));
        // A sequence shorter than ZooKeeper's: not a lock node in any layout.
        for names in NodeNames::VALUES.map(|(_, names)| names) {
            assert_eq!(LockNode::parse(&format!("{}42", names.prefix(owner))), None);
        }
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
