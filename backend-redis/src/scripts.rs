//! The Lua scripts behind the Redis protocol, shared with the Redlock backend.
//!
//! Layout per lock key `K` (both keys share the hash tag, so a Redis Cluster keeps them
//! in one slot): `{K}` holds `"<owner>:<count>"`, or `"<owner>:<count>:<label>"` for a
//! grant with a label, with a PX expiry; `{K}:fence` is the fence
//! counter. Releases are published on the lock key's channel. The fencing token handed
//! out is the count with 10 low bits of the owner id appended ([`token_for`]), so that two
//! holders of one double grant get different tokens.
//!
//! The fence counter comes in two kinds ([`FenceMode`](crate::FenceMode); `fence=none` keeps
//! none, and takes a free lock by `SET NX PX` without a script): a plain `INCR`,
//! or a *clock-floored* counter, `max(counter + 1, server TIME in µs)`, which keeps tokens
//! increasing when the server loses the counter (restart without persistence, failover to
//! an asynchronous replica), as long as the server's clock does not run backwards past
//! the last token. Tokens stay below 2^53, so Lua's doubles hold them exactly; they are
//! always formatted with `string.format('%d', …)` (Lua 5.1's `tostring` keeps only 14
//! significant digits), and a plain counter that reaches 2^53 is refused with an error
//! rather than rounded.
//!
//! **The fence key's lifetime.** A clock-floored fence key expires
//! [`FENCE_EXPIRY_FLOOR`] (24 h) or twice the lock's TTL after the last grant, extension or
//! fence raise on it, whichever is later, and never sooner than it already would: it
//! always outlives the lock key, and once both are gone the next token is floored at the
//! server clock anyway. A plain counter (`fence=counter`) never expires, because
//! forgetting it would regress tokens: that mode keeps one small key per lock name ever
//! used.

use std::sync::LazyLock;
use std::time::Duration;

use redis::Script;

/// The least time a clock-floored fence key outlives the last grant, extension or raise
/// on it (it also outlives twice the lock's TTL). Beyond keeping the fence key alive as
/// long as its lock, the day covers tokens that run ahead of this server's clock — a
/// Redlock token taken from a node whose clock is ahead, a step of the clock backwards —
/// by far more than any sane clock error.
pub const FENCE_EXPIRY_FLOOR: Duration = Duration::from_secs(24 * 3600);

// The Lua the scripts share, in pieces, so that each script defines only the functions
// it calls (a script's local functions are made anew on every call).

/// The readers' mark at the lock key (see [`ACQUIRE_SHARED`]).
macro_rules! lua_mark {
    () => {
        r#"
local READERS = 'readers'
"#
    };
}

/// Keeps a clock-floored fence key alive at least max(2 × ttl, a day).
macro_rules! lua_keep_fence {
    () => {
        r#"
local function keep_fence(fence, ttl)
  local want = math.max(2 * tonumber(ttl), 86400000)
  local left = redis.call('PTTL', fence)
  if left >= 0 and left < want then
    redis.call('PEXPIRE', fence, string.format('%d', want))
  end
end
"#
    };
}

/// The fence counter's next count, and its key's expiry.
macro_rules! lua_next_count {
    () => {
        r#"
local function fence_expiry(fence, ttl)
  local want = math.max(2 * tonumber(ttl), 86400000)
  local left = redis.call('PTTL', fence)
  if left > want then want = left end
  return string.format('%d', want)
end
-- The count of a new grant, as a string (or nil and an error reply): `mode` `none` takes
-- `given` (the server's time in µs without it) and touches no fence key; `clock` takes
-- max(counter + 1, server time in µs), or the proposal `given` within `window` µs;
-- anything else INCRs the counter.
local function next_count(fence, ttl, mode, given, window)
  if mode == 'none' then
    local count = tonumber(given)
    if not count then
      local now = redis.call('TIME')
      count = tonumber(now[1]) * 1000000 + tonumber(now[2])
    end
    return string.format('%d', count)
  elseif mode == 'clock' then
    local now = redis.call('TIME')
    local floor = tonumber(now[1]) * 1000000 + tonumber(now[2])
    local least = tonumber(redis.call('GET', fence) or '0') + 1
    local token = math.max(least, floor)
    local proposed = tonumber(given)
    window = math.min(math.max(tonumber(window) or 0, 0), 1000000)
    if proposed and proposed == math.floor(proposed) and proposed >= least
        and proposed <= floor and proposed >= floor - window then
      token = proposed
    end
    token = string.format('%d', token)
    redis.call('SET', fence, token, 'PX', fence_expiry(fence, ttl))
    return token
  end
  -- INCR replies with an integer, which reaches Lua as a double: format it with %d,
  -- as tostring() prints only 14 significant digits (1e14 and up: 1.2345e+14).
  local n = redis.call('INCR', fence)
  if n >= 9007199254740992 then
    return nil, redis.error_reply('TENURE fence counter ' .. fence .. ' reached 2^53')
  end
  -- A plain counter must never expire (also when the key was used in clock mode).
  redis.call('PERSIST', fence)
  return string.format('%d', n)
end
"#
    };
}

/// The server's clock in ms, and the readers' records pruned.
macro_rules! lua_readers {
    () => {
        r#"
local function now_ms()
  local now = redis.call('TIME')
  return tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
end
-- Drops the readers' records whose deadline has passed; returns the latest deadline
-- left (0: none).
local function prune_readers(readers, now)
  local latest = 0
  local records = redis.call('HGETALL', readers)
  for i = 1, #records, 2 do
    local deadline = tonumber(string.match(records[i + 1], '^(%d+):'))
    if not deadline or deadline <= now then
      redis.call('HDEL', readers, records[i])
    elseif deadline > latest then
      latest = deadline
    end
  end
  return latest
end
"#
    };
}

/// Takes the first free of one or more locks (or the one already ours: a retried acquire
/// whose reply was lost). KEYS: per lock, the lock key then its fence key (the lock keys
/// alone in `none` mode). ARGV: owner, ttl ms, fence mode (`clock` for the clock-floored
/// counter, `none` for no counter, anything else for `INCR`), optionally a label stored
/// after the count (a retry keeps the label first stored; empty for none), and in `none`
/// mode the count to store (the server's time in µs without it); in `clock` mode a
/// proposed count and a window in µs: the count is taken instead of the counter's when
/// it is at least the counter's next value, not ahead of the server's clock, and behind
/// it by at most the window (capped at [`PROPOSAL_WINDOW_MAX`]). Redlock proposes one
/// count to every node of a round. Returns
/// `{1, count, i}` when lock `i` (from 0, in KEYS order) is granted, `{0, pttl, -1}`
/// when every lock is held by another (`pttl`: the shortest remaining time among them),
/// `{0, pttl, -2}` when readers ([`ACQUIRE_SHARED`]) hold one of them: a writer that
/// waits then marks itself, so that no further reader is granted before it.
///
/// An owner already holding one of the locks gets that one back, never a second: every
/// lock is checked for the owner before a free one is taken; its expiry is pushed to the
/// ttl, never shortened (as [`EXTEND`]).
///
/// In `clock` mode the fence key gets (or keeps) an expiry of at least
/// max(2 × ttl, [`FENCE_EXPIRY_FLOOR`]); in `INCR` mode it is made persistent. In `none`
/// mode (Redlock with `fencing=false`) the fence key is not touched and need not be
/// passed: the count is the caller's, backed by no counter (a client sends its clock).
pub const ACQUIRE: &str = concat!(
    lua_mark!(),
    lua_next_count!(),
    r#"
local step = 2
if ARGV[3] == 'none' then step = 1 end
local values = {}
for i = 1, #KEYS, step do
  local current = redis.call('GET', KEYS[i])
  values[i] = current
  if current then
    local sep = string.find(current, ':', 1, true)
    if sep and string.sub(current, 1, sep - 1) == ARGV[1] then
      if redis.call('PTTL', KEYS[i]) < tonumber(ARGV[2]) then
        redis.call('PEXPIRE', KEYS[i], ARGV[2])
      end
      if ARGV[3] == 'clock' and redis.call('PTTL', KEYS[i + 1]) >= 0 then
        redis.call('PEXPIRE', KEYS[i + 1], fence_expiry(KEYS[i + 1], ARGV[2]))
      end
      return {1, tonumber(string.match(current, '^[^:]*:(%d+)')), (i - 1) / step}
    end
  end
end
local shortest, read_held = -2, false
for i = 1, #KEYS, step do
  if not values[i] then
    local token, refused = next_count(KEYS[i + 1], ARGV[2], ARGV[3], ARGV[5], ARGV[6])
    if not token then return refused end
    local value = ARGV[1] .. ':' .. token
    if ARGV[4] and ARGV[4] ~= '' then value = value .. ':' .. ARGV[4] end
    redis.call('SET', KEYS[i], value, 'PX', ARGV[2])
    return {1, tonumber(token), (i - 1) / step}
  end
  if values[i] == READERS then read_held = true end
  local pttl = redis.call('PTTL', KEYS[i])
  if shortest < 0 or (pttl >= 0 and pttl < shortest) then shortest = pttl end
end
if read_held then return {0, shortest, -2} end
return {0, shortest, -1}
"#
);

/// Pushes the expiry only if the lock is still ours (owner ids are unique per grant, so
/// the owner alone identifies it), and never shortens it: a key with more than the ttl
/// left keeps its expiry, so an extension that arrives late (stalled behind a slow
/// connection, after a longer one) is a no-op. KEYS: lock, and optionally the fence key.
/// ARGV: owner, ttl ms. Returns 1 when the lock is ours (and lives at least the ttl
/// more), 0 otherwise.
///
/// With the fence key, a fence key that has an expiry (clock mode) is kept alive for at
/// least max(2 × ttl, [`FENCE_EXPIRY_FLOOR`]); a persistent one (a plain counter) is left
/// alone. Without it (the original calling convention) only the lock is touched.
pub const EXTEND: &str = concat!(
    lua_keep_fence!(),
    r#"
local current = redis.call('GET', KEYS[1])
if current and string.sub(current, 1, 33) == ARGV[1] .. ':' then
  local extended = 1
  if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
    extended = redis.call('PEXPIRE', KEYS[1], ARGV[2])
  end
  if KEYS[2] then keep_fence(KEYS[2], ARGV[2]) end
  return extended
end
return 0
"#
);

/// Ends the grant of an owner, a writer's or a reader's, and announces a key left free
/// on the channel (none if empty): by `PUBLISH`, or with `sharded` by `SPUBLISH` (a Redis
/// Cluster, where the channel shares the lock key's slot). A server that refuses the
/// message (an ACL without the channel, a server without `SPUBLISH`: before Redis 7) still
/// releases; its waiters cannot subscribe either, and poll.
/// KEYS: lock, and optionally its readers' records ([`ACQUIRE_SHARED`]). ARGV: owner,
/// channel, and optionally `sharded`. A writer's lock is deleted if it is the owner's; a
/// reader's record is removed, and the readers' mark follows the latest deadline left
/// (deleted with the last reader). Returns 1 when the owner's grant was in date and is
/// ended (2 when the message was refused), 0 otherwise (a reader's record past its
/// deadline is removed all the same).
pub const RELEASE: &str = concat!(
    lua_mark!(),
    lua_readers!(),
    r#"
local current = redis.call('GET', KEYS[1])
local released = 0
if current and string.sub(current, 1, 33) == ARGV[1] .. ':' then
  redis.call('DEL', KEYS[1])
  released = 1
elseif KEYS[2] and current == READERS then
  local mine = redis.call('HGET', KEYS[2], ARGV[1])
  if not mine then return 0 end
  redis.call('HDEL', KEYS[2], ARGV[1])
  local now = now_ms()
  if (tonumber(string.match(mine, '^(%d+):')) or 0) > now then released = 1 end
  local latest = prune_readers(KEYS[2], now)
  if latest > now then
    -- Other readers hold on: the mark lives as long as the latest of them.
    redis.call('PEXPIRE', KEYS[1], string.format('%d', latest - now))
    redis.call('PEXPIRE', KEYS[2], string.format('%d', latest - now))
    return released
  end
  redis.call('DEL', KEYS[1], KEYS[2])
else
  return 0
end
if ARGV[2] ~= '' then
  local publish = 'PUBLISH'
  if ARGV[3] == 'sharded' then publish = 'SPUBLISH' end
  local sent = redis.pcall(publish, ARGV[2], 'released')
  if type(sent) == 'table' and sent.err and released == 1 then return 2 end
end
return released
"#
);

/// Takes a reader's grant of a lock: granted while no writer holds the key and no writer
/// waits for it (the writer's mark, [`UNMARK_WRITER`]), so a stream of readers never starves
/// a writer. The lock key then holds the mark `readers` with the expiry of the latest
/// reader's deadline, so writers (and other recipes' clients) see it held; each reader's
/// record sits in a hash beside it, field owner, value `<deadline ms>:<count>[:label]`
/// (the server's clock), which the grant prunes of readers past their deadline: a grant
/// reads every record, so it costs time in the number of readers. The count comes from
/// the fence counter as a writer's does, so every grant's token is larger than every
/// earlier one, readers' and writers' alike.
///
/// KEYS: lock, readers' records, writer's mark, and the fence key (not in `none` mode).
/// ARGV: as [`ACQUIRE`]'s (owner, ttl ms, fence mode, label, count or proposal, window).
/// Returns `{1, count, 0}` when granted (or the owner's grant is already in date: a
/// retried request), `{0, pttl, -1}` when a writer holds or waits (`pttl`: its time left).
pub const ACQUIRE_SHARED: &str = concat!(
    lua_mark!(),
    lua_next_count!(),
    lua_readers!(),
    r#"
local lock, readers, writer = KEYS[1], KEYS[2], KEYS[3]
local ttl = tonumber(ARGV[2])
local current = redis.call('GET', lock)
if current and current ~= READERS then return {0, redis.call('PTTL', lock), -1} end
local now = now_ms()
local mine = redis.call('HGET', readers, ARGV[1])
if mine then
  local deadline, count = string.match(mine, '^(%d+):(%d+)')
  deadline = tonumber(deadline) or 0
  if deadline > now then
    -- The mark may have gone (deleted by hand): the reader in date keeps writers out.
    if not current then
      redis.call('SET', lock, READERS, 'PX', string.format('%d', deadline - now))
    end
    return {1, tonumber(count), 0}
  end
end
local waiting = redis.call('PTTL', writer)
if waiting > 0 then return {0, waiting, -1} end
local token, refused = next_count(KEYS[4], ARGV[2], ARGV[3], ARGV[5], ARGV[6])
if not token then return refused end
local latest = math.max(prune_readers(readers, now), now + ttl)
local record = string.format('%d', now + ttl) .. ':' .. token
if ARGV[4] and ARGV[4] ~= '' then record = record .. ':' .. ARGV[4] end
redis.call('HSET', readers, ARGV[1], record)
local left = string.format('%d', latest - now)
if not current then
  redis.call('SET', lock, READERS, 'PX', left)
elseif redis.call('PTTL', lock) < latest - now then
  redis.call('PEXPIRE', lock, left)
end
redis.call('PEXPIRE', readers, left)
return {1, tonumber(token), 0}
"#
);

/// Pushes a reader's deadline to now + ttl, never earlier than it was, if its record is
/// in date; the readers' mark and records live at least as long. KEYS: lock, readers'
/// records, and optionally the fence key (kept alive as [`EXTEND`] keeps it). ARGV: owner,
/// ttl ms. Returns 1 when the reader holds (and now for at least the ttl), 0 otherwise.
pub const EXTEND_SHARED: &str = concat!(
    lua_mark!(),
    lua_keep_fence!(),
    lua_readers!(),
    r#"
if redis.call('GET', KEYS[1]) ~= READERS then return 0 end
local mine = redis.call('HGET', KEYS[2], ARGV[1])
if not mine then return 0 end
local now = now_ms()
local deadline, rest = string.match(mine, '^(%d+)(:.*)$')
deadline = tonumber(deadline)
if not deadline or deadline <= now then return 0 end
local ttl = tonumber(ARGV[2])
if now + ttl > deadline then
  redis.call('HSET', KEYS[2], ARGV[1], string.format('%d', now + ttl) .. rest)
end
for i = 1, 2 do
  if redis.call('PTTL', KEYS[i]) < ttl then redis.call('PEXPIRE', KEYS[i], ARGV[2]) end
end
if KEYS[3] then keep_fence(KEYS[3], ARGV[2]) end
return 1
"#
);

/// A waiting writer's mark, which keeps further readers out ([`ACQUIRE_SHARED`]) until
/// it expires or is taken back: `SET mark <waiter> PX ms` marks; this takes it back if
/// it is still `waiter`'s (another writer may have marked since) and announces it on the
/// channel (none if empty; `sharded` as [`RELEASE`]), waking the readers it held back.
/// KEYS: mark. ARGV: waiter, channel, optionally `sharded`. Returns 1 if taken back.
pub const UNMARK_WRITER: &str = r#"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
if ARGV[2] ~= '' then
  local publish = 'PUBLISH'
  if ARGV[3] == 'sharded' then publish = 'SPUBLISH' end
  redis.pcall(publish, ARGV[2], 'released')
end
return 1
"#;

/// The write round of a quorum max-register (Redlock fencing): raises the fence counter
/// to at least the token and, if the lock is still ours, records the token in it (keeping
/// its label).
/// KEYS: lock, fence. ARGV: owner, token, and optionally the fence mode. Returns 1 if the
/// lock is still ours, else 0.
///
/// With mode `clock` the fence key gets (or keeps) an expiry of at least
/// max(2 × the lock's PTTL, [`FENCE_EXPIRY_FLOOR`]). Without a mode, or with any other,
/// the fence key is written without expiry (the original behaviour, right for a plain
/// counter).
pub const RAISE_FENCE: &str = r#"
local token = tonumber(ARGV[2])
local fence = tonumber(redis.call('GET', KEYS[2]) or '0')
if ARGV[3] == 'clock' then
  local want = math.max(2 * redis.call('PTTL', KEYS[1]), 86400000)
  local left = redis.call('PTTL', KEYS[2])
  if left > want then want = left end
  want = string.format('%d', want)
  if token > fence then
    redis.call('SET', KEYS[2], ARGV[2], 'PX', want)
  elseif left ~= -2 then
    redis.call('PEXPIRE', KEYS[2], want)
  end
elseif token > fence then
  redis.call('SET', KEYS[2], ARGV[2])
end
local current = redis.call('GET', KEYS[1])
if current and string.sub(current, 1, 33) == ARGV[1] .. ':' then
  local label = string.match(current, '^[^:]*:%d+(.*)$') or ''
  redis.call('SET', KEYS[1], ARGV[1] .. ':' .. ARGV[2] .. label, 'KEEPTTL')
  return 1
end
return 0
"#;

/// Reads each holder's value and remaining time. KEYS: per lock, the lock and its
/// readers' records. Returns `{value, pttl}` per lock, in order: `{false, -2}` for a free
/// one; for one readers hold, the record of the reader in date whose lease ends last, as
/// a writer's value (`<owner>:<count>[:label]`) and its time left.
pub const INSPECT: &str = concat!(
    lua_mark!(),
    lua_readers!(),
    r#"
local read = {}
for i = 1, #KEYS, 2 do
  local value = redis.call('GET', KEYS[i])
  local pttl = redis.call('PTTL', KEYS[i])
  if value == READERS then
    -- A mark outliving every reader (by a millisecond) holds nobody: shown free.
    value, pttl = false, -2
    local now, latest = now_ms(), 0
    local records = redis.call('HGETALL', KEYS[i + 1])
    for r = 1, #records, 2 do
      local deadline, rest = string.match(records[r + 1], '^(%d+)(:.*)$')
      deadline = tonumber(deadline)
      if deadline and deadline > now and deadline > latest then
        latest, value, pttl = deadline, records[r] .. rest, deadline - now
      end
    end
  end
  read[#read + 1] = value
  read[#read + 1] = pttl
end
return read
"#
);

/// The widest window behind a server's clock in which it takes a proposed count (see
/// [`ACQUIRE`]). A count so taken is never ahead of the server's clock: proposals add no
/// lead, and tokens stay where they were without them (at most the fastest counting
/// node's clock, or one past a fence raised to that).
pub const PROPOSAL_WINDOW_MAX: Duration = Duration::from_secs(1);

/// The scripts, built once per process (their SHA-1 is computed at construction).
#[derive(Debug)]
pub struct Scripts {
    /// [`ACQUIRE`].
    pub acquire: Script,
    /// [`EXTEND`].
    pub extend: Script,
    /// [`RELEASE`].
    pub release: Script,
    /// [`INSPECT`].
    pub inspect: Script,
    /// [`RAISE_FENCE`].
    pub raise_fence: Script,
    /// [`ACQUIRE_SHARED`].
    pub acquire_shared: Script,
    /// [`EXTEND_SHARED`].
    pub extend_shared: Script,
    /// [`UNMARK_WRITER`].
    pub unmark_writer: Script,
}

/// The shared script set.
pub static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    acquire: Script::new(ACQUIRE),
    extend: Script::new(EXTEND),
    release: Script::new(RELEASE),
    inspect: Script::new(INSPECT),
    raise_fence: Script::new(RAISE_FENCE),
    acquire_shared: Script::new(ACQUIRE_SHARED),
    extend_shared: Script::new(EXTEND_SHARED),
    unmark_writer: Script::new(UNMARK_WRITER),
});

/// The code of the script whose SHA-1 is `hash` (lower-case hex), if it is one of
/// [`SCRIPTS`].
pub(crate) fn code_of(hash: &[u8]) -> Option<&'static str> {
    let scripts = &*SCRIPTS;
    [
        (&scripts.acquire, ACQUIRE),
        (&scripts.extend, EXTEND),
        (&scripts.release, RELEASE),
        (&scripts.inspect, INSPECT),
        (&scripts.raise_fence, RAISE_FENCE),
        (&scripts.acquire_shared, ACQUIRE_SHARED),
        (&scripts.extend_shared, EXTEND_SHARED),
        (&scripts.unmark_writer, UNMARK_WRITER),
    ]
    .into_iter()
    .find(|(script, _)| script.get_hash().as_bytes().eq_ignore_ascii_case(hash))
    .map(|(_, code)| code)
}

/// One command, written straight into one command buffer: a script's `EVALSHA sha
/// numkeys key… arg…`, or a plain command such as `SET`. The client's `ScriptInvocation`
/// first copies every key and argument into a vector of its own, then again into the
/// command: a dozen allocations per call, where this takes two.
pub(crate) struct Call {
    /// The script an `EVALSHA` runs, to load on a server that lacks it.
    script: Option<&'static Script>,
    cmd: redis::Cmd,
    keys_left: usize,
}

impl Call {
    /// A call of `script` with `keys` keys, to be added with [`key`](Self::key) before
    /// any [`arg`](Self::arg).
    pub(crate) fn script(script: &'static Script, keys: usize) -> Self {
        let mut call = Self::command("EVALSHA", keys);
        call.cmd.arg(script.get_hash()).arg(keys);
        call.script = Some(script);
        call
    }

    /// A plain command `name` with `keys` keys, as [`script`](Self::script).
    pub(crate) fn command(name: &'static str, keys: usize) -> Self {
        let mut cmd = redis::Cmd::with_capacity(keys + 8, 64 + 64 * keys);
        cmd.arg(name);
        Self {
            script: None,
            cmd,
            keys_left: keys,
        }
    }

    /// Adds the next key, written as `key` formats (e.g. `format_args!("{k}:fence")`,
    /// without a string of its own).
    pub(crate) fn key(&mut self, key: impl std::fmt::Display) -> &mut Self {
        debug_assert!(self.keys_left > 0, "more keys than announced");
        self.keys_left = self.keys_left.saturating_sub(1);
        redis::RedisWrite::write_arg_fmt(&mut self.cmd, key);
        self
    }

    /// Adds the next argument, after every key.
    pub(crate) fn arg(&mut self, arg: impl redis::ToRedisArgs) -> &mut Self {
        debug_assert_eq!(self.keys_left, 0, "an argument before the last key");
        self.cmd.arg(arg);
        self
    }

    /// Adds the next argument, written as `arg` formats (as [`key`](Self::key)).
    pub(crate) fn arg_fmt(&mut self, arg: impl std::fmt::Display) -> &mut Self {
        debug_assert_eq!(self.keys_left, 0, "an argument before the last key");
        redis::RedisWrite::write_arg_fmt(&mut self.cmd, arg);
        self
    }

    /// The command.
    pub(crate) fn cmd(&self) -> &redis::Cmd {
        debug_assert_eq!(self.keys_left, 0, "fewer keys than announced");
        &self.cmd
    }

    /// The script, to load on a server that does not have it yet (`None` for a plain
    /// command).
    pub(crate) fn loadable(&self) -> Option<&'static Script> {
        self.script
    }
}

/// The lock key's value while readers hold it (see [`ACQUIRE_SHARED`]).
pub const READERS_MARK: &str = "readers";

/// How many low bits of a fencing token come from the owner id.
pub const OWNER_BITS: u32 = 10;

/// The largest fence count a token can carry: below 2^53, the range Lua's doubles hold
/// exactly, so tokens stay below 2^63 and fit a signed 64-bit database column.
pub const MAX_COUNT: u64 = (1 << 53) - 1;

/// The fencing token of a grant at fence count `count` to `owner`:
/// `count · 2^10 + (the owner id's low 10 bits)`.
///
/// Tokens of successive grants increase with the count; two grants that got the same
/// count — a double grant after the server forgot its counter, or a Redlock node that
/// forgot it in the overlap of two majorities — still get different tokens unless their
/// random owner ids share their low 10 bits (probability 2^-10), so a fenced store can
/// tell the two holders apart.
pub fn token_for(
    count: u64,
    owner: tenure_api::OwnerId,
) -> Result<tenure_api::FencingToken, tenure_api::LockError> {
    if count == 0 || count > MAX_COUNT {
        return Err(tenure_api::LockError::backend(format!(
            "fence count {count} is outside 1..=2^53-1"
        )));
    }
    let [.., high, low] = owner.0;
    let suffix = u64::from(u16::from_be_bytes([high, low])) & ((1 << OWNER_BITS) - 1);
    Ok(tenure_api::FencingToken((count << OWNER_BITS) | suffix))
}

/// The fence count a token was made from (the inverse of [`token_for`]).
pub fn count_of(token: tenure_api::FencingToken) -> u64 {
    token.get() >> OWNER_BITS
}

/// A stored lock value, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockValue {
    /// Who holds the lock.
    pub owner: tenure_api::OwnerId,
    /// The grant's fencing token.
    pub token: tenure_api::FencingToken,
    /// The grant's label, if it had one.
    pub label: Option<String>,
}

/// The holder the string `value` at lock key `redis_key` records, with the key's `pttl`
/// (`-1`: no expiry): tenure's (`<owner>:<count>[:<label>]`), or, when it does not parse,
/// another recipe's (redis-py's token): owner derived from the key, no token, the value
/// as its label.
pub(crate) fn holder_of(redis_key: &str, value: &str, pttl: i64) -> tenure_api::HolderInfo {
    let remaining = u64::try_from(pttl)
        .ok()
        .map(std::time::Duration::from_millis);
    match parse_lock_value(value) {
        Ok(value) => tenure_api::HolderInfo {
            owner: value.owner,
            token: Some(value.token),
            remaining,
            label: value.label,
            foreign: false,
        },
        Err(_) => tenure_api::HolderInfo {
            owner: tenure_api::OwnerId::derived(redis_key.as_bytes()),
            token: None,
            remaining,
            label: tenure_api::backend::foreign_label(value.as_bytes()),
            foreign: true,
        },
    }
}

/// Parses a stored lock value (`"<owner>:<count>"` or `"<owner>:<count>:<label>"`).
pub fn parse_lock_value(value: &str) -> Result<LockValue, tenure_api::LockError> {
    let malformed = |what| tenure_api::LockError::backend(format!("malformed {what} in {value:?}"));
    let mut parts = value.splitn(3, ':');
    let (Some(owner), Some(count)) = (parts.next(), parts.next()) else {
        return Err(malformed("lock value"));
    };
    let count = count.parse::<u64>().map_err(|_| malformed("token"))?;
    let owner = tenure_api::OwnerId::parse(owner)?;
    Ok(LockValue {
        owner,
        token: token_for(count, owner)?,
        label: parts.next().map(str::to_owned),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scripts_use_the_documented_fence_expiry_floor() {
        let floor = FENCE_EXPIRY_FLOOR.as_millis().to_string();
        for script in [ACQUIRE, EXTEND, RAISE_FENCE] {
            assert!(script.contains(&floor), "{script}");
        }
    }

    #[test]
    fn the_scripts_mark_read_held_keys_as_documented() {
        let mark = format!("local READERS = '{READERS_MARK}'");
        for script in [ACQUIRE, ACQUIRE_SHARED, EXTEND_SHARED, RELEASE, INSPECT] {
            assert!(script.contains(&mark), "{script}");
        }
    }

    #[test]
    fn the_acquire_script_caps_the_proposal_window_as_documented() {
        let cap = format!("0), {})", PROPOSAL_WINDOW_MAX.as_micros());
        assert!(ACQUIRE.contains(&cap), "{ACQUIRE}");
    }

    #[test]
    fn tokens_order_by_count_and_differ_by_owner() {
        use tenure_api::OwnerId;
        let a = OwnerId([0xab; 16]);
        let mut b = a;
        b.0[15] ^= 1;
        let (ta, tb) = (token_for(7, a).unwrap(), token_for(7, b).unwrap());
        assert_ne!(ta, tb, "one count, two owners: two tokens");
        assert_eq!((count_of(ta), count_of(tb)), (7, 7));
        assert!(token_for(8, a).unwrap() > tb && token_for(8, b).unwrap() > ta);
        let top = token_for(MAX_COUNT, OwnerId([0xff; 16])).unwrap();
        assert!(top.get() < 1 << 63, "fits a signed 64-bit column");
        assert!(token_for(0, a).is_err() && token_for(MAX_COUNT + 1, a).is_err());
        let value = format!("{a}:7");
        let parsed = parse_lock_value(&value).unwrap();
        assert_eq!((parsed.owner, parsed.token, parsed.label), (a, ta, None));
        let labelled = parse_lock_value(&format!("{a}:7:host:1")).unwrap();
        assert_eq!(
            labelled.label.as_deref(),
            Some("host:1"),
            "a label may hold ':'"
        );
        assert!(parse_lock_value(&format!("{a}:0")).is_err());
        assert!(parse_lock_value(&format!("{a}:x:label")).is_err());
    }
}
