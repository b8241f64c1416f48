#![doc = include_str!("../docs.md")]

mod admin;
mod config;
#[cfg(feature = "testbed")]
mod floor;
#[cfg(feature = "testbed")]
mod lab;
mod quorum;
#[cfg(feature = "testbed")]
mod verdicts;

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::future::join_all;
use tenure_api::backend::{deadline, default_drift, poll_acquire_woken, Backend, Driver};
use tenure_api::{
    validate_ttl, AcquireOptions, Backoff, Capabilities, DistributedLock, ExpiryKind, Fairness,
    FencingKind, FencingToken, HolderInfo, Lease, LockError, LockKey, OwnerId, ReleaseOutcome,
    Replication, SystemClock, WaitKind,
};
use tenure_redis::{scripts, Grant, Proposal, RedisLock};
use tokio::sync::{mpsc, oneshot, watch, OnceCell};

use quorum::{gather, InFlight, Tally, Verdict};

pub use config::{RedlockConfig, MAX_NODE_TIMEOUT, MIN_NODE_TIMEOUT};
#[cfg(feature = "testbed")]
pub use lab::TESTBED;

/// A Redlock client over N independent Redis masters. Cheap to share (`Arc`).
#[derive(Clone)]
pub struct Redlock {
    inner: Arc<Inner>,
}

struct Inner {
    config: RedlockConfig,
    nodes: Vec<OnceCell<RedisLock>>,
    /// Each node's connection attempt in flight, while it has no client yet (see
    /// [`Inner::connected`]).
    connecting: Vec<Mutex<Option<Connecting>>>,
    /// Each node's `host:port`, for errors (formatted once, not on every request).
    endpoints: Vec<String>,
    in_flight: Arc<InFlight>,
}

impl fmt::Debug for Redlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Redlock")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl Redlock {
    /// This backend for URL dispatch ([`Driver`]): `redlock://`, `redlocks://`.
    pub const DRIVER: Driver = Driver {
        name: "redlock",
        schemes: &["redlock", "redlocks"],
        connect: |url| Box::pin(async move { Self::connect(url).await.map(Backend::new) }),
    };

    /// Connects to the nodes of a `redlock://h1:p,h2:p,…` URL (see [`RedlockConfig`]).
    ///
    /// # Cancel safety
    /// Cancel-safe.
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        Self::with_config(RedlockConfig::from_url(url)?).await
    }

    /// Validates the configuration ([`RedlockConfig::validate`]: a bad one is
    /// [`LockError::Config`], never a panic), then connects to every node concurrently.
    /// Succeeds when a majority is reachable; the others are connected to lazily, on
    /// later calls, each attempt in a task of its own within the node's connect timeout
    /// (never cut short by a call's node timeout).
    ///
    /// # Cancel safety
    /// Cancel-safe.
    pub async fn with_config(config: RedlockConfig) -> Result<Self, LockError> {
        config.validate()?;
        let nodes = config.nodes.iter().map(|_| OnceCell::new()).collect();
        let connecting = config.nodes.iter().map(|_| Mutex::new(None)).collect();
        let limit = config
            .nodes
            .iter()
            .map(|node| node.connect_timeout)
            .max()
            .unwrap_or(MIN_NODE_TIMEOUT)
            .saturating_mul(2);
        let lock = Self {
            inner: Arc::new(Inner {
                endpoints: config.nodes.iter().map(|node| node.endpoint()).collect(),
                config,
                nodes,
                connecting,
                in_flight: Arc::default(),
            }),
        };
        let results = lock.inner.fan_out(limit, |_, _| async { Ok(()) }).await;
        let connected = results.iter().filter(|r| r.is_ok()).count();
        let needed = lock.inner.config.quorum();
        if connected < needed {
            // A refusal no retry can fix (credentials, certificates, settings) is the
            // answer, rather than a bare retryable `NoQuorum`.
            if let Some(refusal) = results
                .into_iter()
                .filter_map(Result::err)
                .find(|e| !e.is_retryable())
            {
                return Err(refusal);
            }
            return Err(LockError::NoQuorum {
                got: connected,
                needed,
            });
        }
        Ok(lock)
    }

    /// The configuration (its `Display` hides passwords).
    pub fn config(&self) -> &RedlockConfig {
        &self.inner.config
    }
}

/// Per-node release answers: whether the node was busy with the round's request when
/// the release was asked for, and whether it released.
type ReleaseAnswers = mpsc::UnboundedReceiver<(bool, Result<bool, LockError>)>;

/// Where a round stands, as seen by its node requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Not decided yet.
    Pending,
    /// The lease is held: grants are ours to keep (the holder releases them). With the
    /// token when no fence round recorded it: a grant of ours not known to name it (one
    /// that came back after the decision with another count, or whose reply was lost)
    /// records it then.
    Held(Option<FencingToken>),
    /// The round failed: every grant, also one that lands late, must be released.
    Failed,
    /// A majority granted, but the round gave the lock up (its validity ran out, or the
    /// fence round failed): released as [`Failed`](Phase::Failed), and announced, since
    /// waiters saw the lock held.
    Abandoned,
}

/// A node's connection attempt, shared by the callers waiting for it (see
/// [`Inner::connected`]).
type Connecting =
    futures::future::Shared<futures::future::BoxFuture<'static, Result<(), Arc<LockError>>>>;

/// A copy of a connection attempt's error for one of its callers: the same kind and
/// message (the client library's error stays with the attempt).
fn copied(error: &LockError) -> LockError {
    match error {
        LockError::Config(message) => LockError::Config(message.clone()),
        LockError::InvalidInput(message) => LockError::InvalidInput(message.clone()),
        LockError::Backend { message, .. } => LockError::backend(message.clone()),
        LockError::Unavailable { message, .. } => LockError::Unavailable {
            message: message.clone(),
            source: None,
        },
        other => LockError::Unavailable {
            message: other.to_string(),
            source: None,
        },
    }
}

/// Spawns `task` boxed. The tasks embed the whole Redis call chain of every node and are
/// several KB; tokio moves an unboxed future into its task cell and overwrites it with the
/// output on completion, copying all of it each time. Boxed, the cell holds a pointer.
fn spawn(task: impl Future<Output = ()> + Send + 'static) {
    tokio::spawn(Box::pin(task));
}

/// `call` (step `what`) on `node`, given up after `limit` (as a request with no reply):
/// for the rare calls that take no bound of their own (inspection, admin scans).
async fn within<T>(
    what: &str,
    node: &RedisLock,
    limit: Duration,
    call: impl Future<Output = Result<T, LockError>>,
) -> Result<T, LockError> {
    let endpoint = node.config().endpoint();
    tenure_api::backend::bounded(limit, what, &endpoint, call, |e| e).await
}

/// One node's grant: with the node's fence counter, proposing the round's count
/// (`Some`, see [`RedisLock::grant_proposing`]), or without any counter
/// (`None`: `fencing=false`, no fence key is written, see [`RedisLock::grant_unfenced`]).
async fn grant(
    node: &RedisLock,
    key: &LockKey,
    owner: OwnerId,
    ttl: Duration,
    label: Option<&str>,
    proposed: Option<Proposal>,
    limit: Duration,
) -> Result<Grant, LockError> {
    match proposed {
        Some(proposal) => {
            node.grant_proposing(key, owner, ttl, label, proposal, limit)
                .await
        }
        None => node.grant_unfenced(key, owner, ttl, label, limit).await,
    }
}

/// The count a round proposes to every node: this client's clock in µs at the round's
/// start. A node's script runs later, so on a node whose clock agrees the proposal is
/// behind its clock by the request's time, and it is taken within the window the round
/// passes with it (its request bound: an answer later than that does not count). (A
/// margin below the clock, for clients whose clocks run ahead of the nodes', kept a
/// contended key's rounds disagreeing: the last fence, a node's clock, stayed ahead of
/// the proposals made within the margin of it.)
fn proposal() -> u64 {
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(since_epoch.as_micros())
        .map_or(scripts::MAX_COUNT, |c| c.clamp(1, scripts::MAX_COUNT))
}

impl Inner {
    /// Runs `op` on node `index`, connecting first if needed, all within `limit`: `op`
    /// gets the time left, and bounds its request by it. The node client itself bounds
    /// the request, so one that got no reply in its time condemns its connection there
    /// (see [`RedisLock::grant`]), where a timer around the call would cut it first and
    /// leave the node client using a connection that owes a reply.
    async fn on_node<'a, T, F, Fut>(
        self: &'a Arc<Self>,
        index: usize,
        limit: Duration,
        op: F,
    ) -> Result<T, LockError>
    where
        F: FnOnce(&'a RedisLock, Duration) -> Fut,
        Fut: Future<Output = Result<T, LockError>> + 'a,
    {
        let node = match self.nodes[index].get() {
            Some(node) => node,
            None => {
                let started = Instant::now();
                let node = self.connected(index, limit).await?;
                return op(node, limit.saturating_sub(started.elapsed())).await;
            }
        };
        op(node, limit).await
    }

    /// Node `index`'s client, waiting up to `limit` for its connection. The connection is
    /// made in a task of its own within the node's connect timeout (one at a time:
    /// callers meanwhile wait for the same attempt), so a caller's short bound — the node
    /// timeout, 50 ms for a TTL up to 5 s — never cuts it short: a node whose TCP, TLS
    /// and `AUTH` take longer than that, or that was down at start-up, joins once it
    /// answers.
    ///
    /// # Cancel safety
    /// Cancel-safe: the connection attempt carries on without the caller.
    async fn connected(
        self: &Arc<Self>,
        index: usize,
        limit: Duration,
    ) -> Result<&RedisLock, LockError> {
        let attempt = self.connect_attempt(index);
        let endpoint = &self.endpoints[index];
        let attempt = async move { attempt.await.map_err(|e| copied(&e)) };
        tenure_api::backend::bounded(limit, "connect", endpoint, attempt, |e| e).await?;
        self.nodes[index]
            .get()
            .ok_or_else(|| LockError::backend(format!("{endpoint}: connected without a client")))
    }

    /// The connection attempt to node `index` in flight, or a new one, in a task of its
    /// own (it sets the node's client, and clears the slot when it ends).
    fn connect_attempt(self: &Arc<Self>, index: usize) -> Connecting {
        let mut slot = self.connecting[index]
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(attempt) = slot.as_ref() {
            return attempt.clone();
        }
        let inner = self.clone();
        let task = tokio::spawn(Box::pin(async move {
            let config = inner.config.nodes[index].clone();
            let connected = inner.nodes[index]
                .get_or_try_init(|| RedisLock::with_config(config))
                .await
                .map(|_| ());
            *inner.connecting[index]
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = None;
            connected.map_err(Arc::new)
        }));
        let attempt = async move {
            task.await
                .unwrap_or_else(|e| Err(Arc::new(LockError::backend(format!("connect task: {e}")))))
        };
        let attempt = futures::FutureExt::shared(futures::FutureExt::boxed(attempt));
        *slot = Some(attempt.clone());
        attempt
    }

    /// Runs `op` on every node concurrently (never one after another) and waits for all.
    async fn fan_out<'a, T, F, Fut>(
        self: &'a Arc<Self>,
        limit: Duration,
        op: F,
    ) -> Vec<Result<T, LockError>>
    where
        F: Fn(&'a RedisLock, Duration) -> Fut + Copy,
        Fut: Future<Output = Result<T, LockError>> + 'a,
    {
        join_all((0..self.nodes.len()).map(|i| self.on_node(i, limit, op))).await
    }

    /// Runs `op` on every node concurrently, in one task of their own; the answers in the
    /// order they arrive. The caller may stop reading once the outcome is certain: the
    /// requests still reach the slower nodes.
    fn broadcast<T, F, Fut>(
        self: &Arc<Self>,
        limit: Duration,
        op: F,
    ) -> mpsc::UnboundedReceiver<Result<T, LockError>>
    where
        T: Send + 'static,
        F: Fn(RedisLock, Duration) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<T, LockError>> + Send + 'static,
    {
        let (answers, received) = mpsc::unbounded_channel();
        let inner = self.clone();
        spawn(async move {
            let (inner, op, answers) = (&inner, &op, &answers);
            join_all((0..inner.nodes.len()).map(|i| async move {
                let answer = inner
                    .on_node(i, limit, |node, left| op(node.clone(), left))
                    .await;
                let _ = answers.send(answer);
            }))
            .await;
        });
        received
    }

    fn quorum_tally(&self) -> Tally {
        Tally::new(self.nodes.len(), self.config.quorum())
    }

    /// Sends `owner`'s release to every node, each behind the owner's previous request to
    /// that node if it is still in flight (see [`InFlight`]), in one task of their own,
    /// so it reaches every node even if the caller stops listening. The answers arrive on
    /// the returned channel, each with whether its node was still busy with the round's
    /// request when the release was asked for; the second value counts those nodes.
    fn release_everywhere(
        self: &Arc<Self>,
        key: &LockKey,
        owner: OwnerId,
        limit: Duration,
    ) -> (ReleaseAnswers, usize) {
        let (answers, received) = mpsc::unbounded_channel();
        let (behind, requests) = self.in_flight.queue(owner, self.nodes.len());
        let busy = behind.busy();
        let (inner, key) = (self.clone(), key.clone());
        spawn(async move {
            let (inner, key, answers, behind) = (&inner, &key, &answers, &behind);
            join_all(
                requests
                    .into_iter()
                    .enumerate()
                    .map(|(i, request)| async move {
                        behind.wait(i).await;
                        let released = inner
                            .on_node(i, limit, |node, left| node.release_owner(key, owner, left))
                            .await;
                        let _ = answers.send((behind.was_busy(i), released));
                        drop(request);
                    }),
            )
            .await;
        });
        (received, busy)
    }

    /// One Redlock round for `owner`, decided as soon as the outcome is certain: a
    /// majority granted (then the fence round, unless the majority's grants agreed on the
    /// token), or a majority can no longer grant, or
    /// more nodes failed for good than a majority can spare; the outcome goes to `reply`
    /// at once. Each node's request outlives the decision (this future resolves once
    /// every node is done): if the round failed, the node is released once its request
    /// has finished — also a grant that lands after the decision; if the round
    /// succeeded, a late grant is ours and [`Redlock::release`] reaches it (it queues
    /// behind the grant). If nobody awaits `reply` any more, a granted lease is
    /// released.
    async fn round(
        self: &Arc<Self>,
        key: &LockKey,
        owner: OwnerId,
        ttl: Duration,
        label: Option<&str>,
        reply: oneshot::Sender<Result<Option<Lease>, LockError>>,
    ) {
        let quorum = self.config.quorum();
        let limit = self.config.node_timeout_for(ttl);
        let drift = default_drift(ttl);
        let start = Instant::now();
        let valid_until = deadline(start, ttl, drift);
        let (decide, decision) = watch::channel(Phase::Pending);
        let (replies, mut received) = mpsc::unbounded_channel();
        let proposed = self.config.fencing.then(|| Proposal {
            count: proposal(),
            window: limit,
        });
        // In flight from now (a release asked for later waits for each node's request),
        // until each node's future drops its `request`. Collected by `join_all` at once,
        // into its own vector: the node futures are large, and collecting them first
        // would allocate and copy them twice.
        // (A fresh owner id: nothing of it is in flight yet.)
        let (_, requests) = self.in_flight.queue(owner, self.nodes.len());
        let nodes = join_all(requests.into_iter().enumerate().map(|(i, request)| {
            let (replies, mut decision) = (replies.clone(), decision.clone());
            async move {
                let reply = self
                    .on_node(i, limit, |node, left| {
                        grant(node, key, owner, ttl, label, proposed, left)
                    })
                    .await;
                let maybe_ours = !matches!(reply, Ok(Grant::Held(_) | Grant::ReadHeld(_)));
                let counted = match reply {
                    Ok(Grant::Granted(token)) => Some(token),
                    _ => None,
                };
                let _ = replies.send(reply);
                let phase = match decision.wait_for(|phase| *phase != Phase::Pending).await {
                    Ok(phase) => *phase,
                    Err(_) => Phase::Failed, // the round is gone without a decision
                };
                if maybe_ours {
                    let _ = match phase {
                        // Nobody was told of this grant: withdrawn without waking
                        // waiters, which would only race again for a lock nobody released.
                        Phase::Failed => {
                            self.on_node(i, limit, |node, left| {
                                node.withdraw_owner(key, owner, left)
                            })
                            .await
                        }
                        Phase::Abandoned => {
                            self.on_node(i, limit, |node, left| {
                                node.release_owner(key, owner, left)
                            })
                            .await
                        }
                        // No fence round ran, and this grant named another count (it
                        // came back after the decision) or may have landed unseen (its
                        // reply failed): it records the lease's token, so that every
                        // node names it (only if the lock is ours there).
                        Phase::Held(Some(token)) if counted != Some(token) => {
                            self.on_node(i, limit, |node, left| {
                                node.raise_fence(key, owner, token, left)
                            })
                            .await
                        }
                        Phase::Pending | Phase::Held(_) => Ok(false),
                    };
                }
                drop(request);
            }
        }));
        drop((replies, decision));
        let decide = async move {
            let mut tally = self.quorum_tally();
            let answers = futures::stream::poll_fn(|cx| received.poll_recv(cx));
            let grants = gather(
                answers,
                &mut tally,
                |reply| matches!(reply, Grant::Granted(_)),
                Tally::settled,
            )
            .await;
            let expired = || LockError::Unavailable {
                message: format!(
                    "a majority granted `{key}` but the validity ran out (replies took \
                     longer than the ttl minus drift)"
                ),
                source: None,
            };
            // The token to record on late grants, when no fence round did.
            let mut unrecorded = None;
            let outcome = match tally.verdict() {
                Some(Verdict::Majority) if Instant::now() >= valid_until => Err(expired()),
                Some(Verdict::Majority) => {
                    let tokens = || {
                        grants.iter().filter_map(|reply| match reply {
                            Grant::Granted(token) => Some(*token),
                            Grant::Held(_) | Grant::ReadHeld(_) => None,
                        })
                    };
                    let token = tokens().max().unwrap_or(FencingToken(0));
                    // Each node wrote its count to its fence key with its grant: where a
                    // majority counted the token itself, the register already holds it.
                    let agreed =
                        self.config.fencing && tokens().filter(|t| *t == token).count() >= quorum;
                    if agreed {
                        unrecorded = Some(token);
                    }
                    match self.confirm(key, owner, token, agreed, limit).await {
                        Ok(()) if Instant::now() >= valid_until => Err(expired()),
                        Ok(()) => Ok(Some(token)),
                        Err(e) => Err(e),
                    }
                }
                Some(Verdict::Fatal) => Err(tally.take_fatal()),
                Some(Verdict::NoMajority) | None if tally.answered() >= quorum => Ok(None),
                Some(Verdict::NoMajority) | None => Err(LockError::NoQuorum {
                    got: tally.yes,
                    needed: quorum,
                }),
            };
            decide.send_replace(match (&outcome, tally.verdict()) {
                (Ok(Some(_)), _) => Phase::Held(unrecorded),
                (_, Some(Verdict::Majority)) => Phase::Abandoned,
                _ => Phase::Failed,
            });
            let lease = outcome.map(|token| {
                token.map(|token| Lease::new(key.clone(), owner, token, start, ttl, drift))
            });
            if let Err(Ok(Some(orphan))) = reply.send(lease) {
                // The node requests go on without us; nobody needs their answers.
                drop(
                    self.release_everywhere(orphan.key(), orphan.owner(), limit)
                        .0,
                );
            }
        };
        futures::join!(nodes, decide);
    }

    /// The fence round: writes `max(fence, token)` to every node; the grant stands once a
    /// majority acknowledged it while the lock was still ours. Decided as soon as that
    /// is certain either way. The writes run in a task of their own and still reach the
    /// slower nodes after the decision (a write only ever raises a fence, and it records
    /// the lease's token in a late grant of ours that has landed, so that nodes name the
    /// same token).
    ///
    /// Skipped without fencing, and when a majority of grants `agreed` on the token: each
    /// of those nodes wrote it to its fence key in the same script that granted the lock,
    /// which is what the round would have made sure of (a later grant there follows this
    /// one's end, so it reads the raised fence). A grant of another count that comes back
    /// after the decision records the token then (see [`Phase::Held`]).
    async fn confirm(
        self: &Arc<Self>,
        key: &LockKey,
        owner: OwnerId,
        token: FencingToken,
        agreed: bool,
        limit: Duration,
    ) -> Result<(), LockError> {
        if !self.config.fencing || agreed {
            return Ok(());
        }
        let key = key.clone();
        let mut received = self.broadcast(limit, move |node, left| {
            let key = key.clone();
            async move { node.raise_fence(&key, owner, token, left).await }
        });
        let mut tally = self.quorum_tally();
        let answers = futures::stream::poll_fn(|cx| received.poll_recv(cx));
        gather(answers, &mut tally, |ours| *ours, |t| t.verdict().is_some()).await;
        match tally.verdict() {
            Some(Verdict::Majority) => Ok(()),
            Some(Verdict::Fatal) => Err(tally.take_fatal()),
            _ => Err(LockError::NoQuorum {
                got: tally.yes,
                needed: tally.quorum,
            }),
        }
    }
}

#[async_trait]
impl DistributedLock for Redlock {
    /// One round, decided as soon as its outcome is certain (see the crate docs).
    ///
    /// # Cancel safety
    /// The round runs in its own task: if this future is dropped, the task finishes the
    /// round and releases whatever it was granted, so no stray key is left behind.
    async fn try_acquire(&self, key: &LockKey, ttl: Duration) -> Result<Option<Lease>, LockError> {
        validate_ttl(ttl)?;
        self.detached_round(key, OwnerId::random(), ttl, None).await
    }

    /// Retries rounds after random delays (jittered backoff) until `opts.wait` has passed.
    /// Every round has an owner id of its own, so that a failed round's clean-up, which
    /// may reach a node late (stalled behind a slow connection), can never delete a later
    /// round's grant there, nor a round's late grant count for a later one. Redlock has no queue, so waiting
    /// polls; but a waiter still waiting after three pauses subscribes to the key's
    /// release channel on every node that allows it, and from then on a release
    /// (`PUBLISH` by the releasing node) cuts its pause short — after a random delay of
    /// up to a tenth of the node timeout, so that woken waiters do not all split the
    /// nodes' votes at once. The backoff keeps growing as without the subscription; a
    /// wake-up adds at most one round per release message (one per node per release),
    /// so releases, not the subscription, bound the extra rounds. What it buys is that a
    /// long waiter is no longer the one that polls least often (it starved). Short waits
    /// skip the subscription (a connection per node). Rounds that fail before a majority
    /// granted withdraw their partial grants without a message, so only locks that were
    /// really held wake waiters. A non-retryable node error on more nodes than a majority can spare
    /// ends the wait at once (see the crate docs).
    ///
    /// # Cancel safety
    /// As `try_acquire`.
    async fn acquire(&self, key: &LockKey, opts: &AcquireOptions) -> Result<Lease, LockError> {
        opts.validate()?;
        let label: Option<Arc<str>> = opts.label.as_deref().map(Arc::from);
        let limit = self.inner.config.node_timeout_for(opts.ttl);
        let watch = Arc::new(std::sync::OnceLock::new());
        let mut pauses = 0u32;
        poll_acquire_woken(
            &SystemClock,
            opts,
            || self.detached_round(key, OwnerId::random(), opts.ttl, label.clone()),
            || {
                pauses += 1;
                let subscribe = pauses > POLLS_BEFORE_SUBSCRIBING;
                let (inner, key, watch) = (self.inner.clone(), key.clone(), watch.clone());
                async move {
                    match watch.get() {
                        Some(watch) => ReleaseWatch::next(watch, limit / 10).await,
                        // Subscribes, then retries at once: a release before the
                        // subscriptions took effect would go unheard.
                        // The subscriptions are set up in tasks owned by the watch, so
                        // a pause that ends first cancels only this wait for them.
                        None if subscribe => {
                            watch
                                .get_or_init(|| inner.watch(&key, limit))
                                .subscribed(limit)
                                .await;
                        }
                        None => std::future::pending().await,
                    }
                }
            },
        )
        .await
    }

    /// Extends on all nodes concurrently; held only if a majority extended within the
    /// validity. Decided as soon as that is certain either way: a majority extended, a
    /// majority can no longer extend ([`LockError::LeaseLost`] when more nodes say the
    /// lock is not ours than a majority can spare, else [`LockError::NoQuorum`]: a node
    /// that did not answer may
    /// still hold it, and [`LockGuard`](tenure_api::LockGuard) retries until the
    /// deadline), or more nodes failed for good than a majority can spare (that node's
    /// non-retryable error). The requests still reach the slower nodes afterwards.
    ///
    /// # Cancel safety
    /// `lease` is unchanged; some nodes may have applied the extension.
    async fn extend(&self, lease: &mut Lease, ttl: Duration) -> Result<(), LockError> {
        validate_ttl(ttl)?;
        let inner = &self.inner;
        let drift = default_drift(ttl);
        let limit = inner.config.node_timeout_for(ttl);
        let start = Instant::now();
        let (key, owner) = (lease.key().clone(), lease.owner());
        let mut tally = inner.quorum_tally();
        let extend_key = key.clone();
        let mut received = inner.broadcast(limit, move |node, left| {
            let key = extend_key.clone();
            async move { node.extend_owner(&key, owner, ttl, left).await }
        });
        let answers = futures::stream::poll_fn(|cx| received.poll_recv(cx));
        gather(answers, &mut tally, |ours| *ours, Tally::settled).await;
        let (nodes, quorum) = (tally.nodes, tally.quorum);
        match tally.verdict() {
            Some(Verdict::Majority) if Instant::now() < deadline(start, ttl, drift) => {
                lease.renewed(start, ttl, drift);
                Ok(())
            }
            Some(Verdict::Majority) => Err(LockError::Unavailable {
                message: format!(
                    "a majority extended `{key}` but the validity ran out (replies took longer than the ttl minus drift)"
                ),
                source: None,
            }),
            Some(Verdict::Fatal) => Err(tally.take_fatal()),
            // Lost only once no majority can hold it for us: a lease granted by a bare
            // majority, one of whose nodes is slow, is unproven (`NoQuorum`, retried by
            // the guard), not lost.
            _ if tally.no > nodes - quorum => {
                Err(LockError::lost(format!(
                    "only {} of {nodes} nodes still hold `{key}` for {owner}",
                    tally.yes
                )))
            }
            _ => Err(LockError::NoQuorum {
                got: tally.yes,
                needed: quorum,
            }),
        }
    }

    /// Releases on every node. The release is sent to all nodes from one background task,
    /// each request behind the round's request to that node if it is still in flight, so
    /// a grant still in flight (a node that had not answered when the acquire was
    /// decided) is released too, once it has come back or timed out. The answer comes
    /// when every node has answered or timed out — not waiting for nodes still busy with
    /// the round's request, once a majority has answered — or as soon as a majority can
    /// no longer answer:
    ///
    /// - `Ok(Released)`: a majority answered and at least one node deleted our lock;
    /// - `Ok(NotHeld)`: a majority answered and none held it for us (it had expired or
    ///   was taken over);
    /// - `Err(Unavailable)`: no majority answered. Nothing is known about the other
    ///   nodes: our lock may stay there until its TTL expires (the message says so), and
    ///   until then others may not reach a majority. The lease is gone either way; the
    ///   background task still tries each node once.
    /// - a node's non-retryable error (e.g. a script or auth error) when more nodes
    ///   failed that way than a majority can spare.
    ///
    /// # Cancel safety
    /// Dropping the future does not stop the releases: they are already on their way to
    /// every node.
    async fn release(&self, lease: Lease) -> Result<ReleaseOutcome, LockError> {
        let inner = &self.inner;
        let limit = inner.config.node_timeout_for(lease.ttl());
        let (mut received, mut busy) = inner.release_everywhere(lease.key(), lease.owner(), limit);
        let mut tally = inner.quorum_tally();
        let quorum = tally.quorum;
        loop {
            let settled = tally.pending() == 0
                || tally.answered() + tally.pending() < quorum
                || (tally.answered() >= quorum && tally.pending() <= busy);
            if settled {
                break;
            }
            match received.recv().await {
                Some((was_busy, answer)) => {
                    busy -= usize::from(was_busy);
                    tally.record(answer);
                }
                None => {
                    tally.abandon_pending();
                    break;
                }
            }
        }
        if tally.answered() >= quorum {
            return Ok(if tally.yes > 0 {
                ReleaseOutcome::Released
            } else {
                ReleaseOutcome::NotHeld
            });
        }
        if tally.fatal > tally.nodes - quorum {
            return Err(tally.take_fatal());
        }
        Err(LockError::Unavailable {
            message: format!(
                "release of `{}` reached no majority: {} of {} nodes released it, {} no longer \
                 held it, {} did not answer; the lock may stay held on those until its TTL \
                 ({:?} from the last grant or extension) expires",
                lease.key(),
                tally.yes,
                tally.nodes,
                tally.no,
                tally.retryable + tally.fatal + tally.pending(),
                lease.ttl()
            ),
            source: tally.take_retryable(),
        })
    }

    /// The owner that a majority of nodes names, with the smallest remaining time among
    /// them and the token most of them name (none with `fencing=false`).
    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, LockError> {
        let inner = &self.inner;
        let quorum = inner.config.quorum();
        let limit = inner
            .config
            .node_timeout_for(Duration::from_secs(1))
            .saturating_mul(10);
        let replies = inner
            .fan_out(limit, |node, left| {
                within("inspect", node, left, node.inspect(key))
            })
            .await;
        let answered = replies.iter().filter(|r| r.is_ok()).count();
        let holders: Vec<HolderInfo> = replies
            .into_iter()
            .filter_map(|r| r.ok().flatten())
            .collect();
        for candidate in &holders {
            let same: Vec<&HolderInfo> = holders
                .iter()
                .filter(|h| h.owner == candidate.owner)
                .collect();
            if same.len() >= quorum {
                // The fence round, or the grants of a majority that agreed, record the
                // lease's token on a majority; a node whose grant came back after the
                // decision may still show its own count for a moment. So: the token
                // most nodes name (the largest among equals).
                let tokens: Vec<FencingToken> = same.iter().filter_map(|h| h.token).collect();
                let token = tokens
                    .iter()
                    .copied()
                    .max_by_key(|t| (tokens.iter().filter(|u| *u == t).count(), *t));
                return Ok(Some(HolderInfo {
                    owner: candidate.owner,
                    // Without the fence round (`fencing=false`) each node holds its own
                    // count, and none of them is the lease's token.
                    token: token.filter(|_| inner.config.fencing),
                    remaining: same.iter().filter_map(|h| h.remaining).min(),
                    // One owner id is one grant, made with one label.
                    label: candidate.label.clone(),
                    foreign: false,
                }));
            }
        }
        if answered < quorum {
            return Err(LockError::NoQuorum {
                got: answered,
                needed: quorum,
            });
        }
        Ok(None)
    }

    fn capabilities(&self) -> Capabilities {
        let nodes = self.inner.config.nodes.len();
        Capabilities {
            backend: "redlock",
            fencing: if self.inner.config.fencing {
                FencingKind::QuorumRegister
            } else {
                FencingKind::None
            },
            expiry: ExpiryKind::ServerTtl,
            replication: Replication::IndependentQuorum { nodes },
            wait: WaitKind::Poll,
            fairness: Fairness::None,
            failures_tolerated: (nodes - 1) / 2,
            clock_dependent: true,
            labels: true,
            shared: false,
        }
    }
}

/// Pauses of a waiting `acquire` before it subscribes to the key's releases (see
/// [`Redlock::acquire`](DistributedLock::acquire)).
const POLLS_BEFORE_SUBSCRIBING: u32 = 3;

/// Release messages for one waiting `acquire`: a task per node subscribed to the key's
/// release channel, counting messages into one `watch` channel. A release that lands
/// during a round is kept for the next wait. The tasks end with the watch.
struct ReleaseWatch {
    /// The count of release messages; closed once every subscription has ended.
    releases: Mutex<watch::Receiver<u64>>,
    /// How many nodes have subscribed or failed to.
    settled: watch::Receiver<usize>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for ReleaseWatch {
    fn drop(&mut self) {
        self.tasks.iter().for_each(tokio::task::JoinHandle::abort);
    }
}

impl ReleaseWatch {
    /// Resolves once every node has subscribed or failed to, or after `limit`.
    ///
    /// # Cancel safety
    /// Cancel-safe: the subscriptions go on in the watch's tasks.
    async fn subscribed(&self, limit: Duration) {
        let nodes = self.tasks.len();
        let mut settled = self.settled.clone();
        let all = settled.wait_for(|n| *n >= nodes);
        let _ = tokio::time::timeout(limit, all).await;
    }

    /// Resolves at the next release message not seen yet (never once no subscription is
    /// left), plus a random delay of up to `jitter`; the messages of that delay count as
    /// seen (one release publishes on every node).
    ///
    /// # Cancel safety
    /// Cancel-safe: a release not yet marked seen wakes the next call.
    async fn next(&self, jitter: Duration) {
        let mut releases = self
            .releases
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if releases.changed().await.is_err() {
            return std::future::pending().await;
        }
        let spread = Backoff {
            initial: jitter,
            max: jitter,
            jitter: 1.0,
        };
        tokio::time::sleep(spread.delay(0)).await;
        self.releases
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .borrow_and_update();
    }
}

impl Inner {
    /// Starts subscribing to `key`'s releases on every node, each in a task the returned
    /// watch owns (and aborts when dropped), each within `limit`. A node that refuses is
    /// only polled.
    fn watch(self: &Arc<Self>, key: &LockKey, limit: Duration) -> ReleaseWatch {
        let (count, releases) = watch::channel(0u64);
        let (settle, settled) = watch::channel(0usize);
        let (count, settle) = (Arc::new(count), Arc::new(settle));
        let tasks = (0..self.nodes.len())
            .map(|i| {
                let (inner, key) = (self.clone(), key.clone());
                let (count, settle) = (count.clone(), settle.clone());
                tokio::spawn(async move {
                    let subscribe = || {
                        inner.on_node(i, limit, |node, left| node.subscribe_releases(&key, left))
                    };
                    let subscribed = subscribe().await;
                    settle.send_modify(|n| *n += 1);
                    drop(settle);
                    let Ok(mut watch) = subscribed else { return };
                    // The node's subscriber connection is shared by the client's waiters:
                    // when it closes, subscribe again (on a new one), after a pause.
                    loop {
                        while watch.released().await {
                            count.send_modify(|n| *n = n.wrapping_add(1));
                        }
                        tokio::time::sleep(limit).await;
                        match subscribe().await {
                            Ok(again) => {
                                watch = again;
                                // A release while no connection listened would be lost:
                                // the waiter tries again now.
                                count.send_modify(|n| *n = n.wrapping_add(1));
                            }
                            Err(e) if e.is_retryable() => continue,
                            Err(_) => return,
                        }
                    }
                })
            })
            .collect();
        ReleaseWatch {
            releases: Mutex::new(releases),
            settled,
            tasks,
        }
    }
}

impl Redlock {
    /// Runs one round in its own task, so that dropping the caller's future cannot cut a
    /// round short between the grant and the clean-up; a grant nobody is waiting for
    /// anymore is released — also one delivered to a caller that was dropped before it
    /// read it (see [`Delivery`]).
    async fn detached_round(
        &self,
        key: &LockKey,
        owner: OwnerId,
        ttl: Duration,
        label: Option<Arc<str>>,
    ) -> Result<Option<Lease>, LockError> {
        let (inner, key) = (self.inner.clone(), key.clone());
        let (reply, answer) = oneshot::channel();
        let mut delivery = Delivery {
            answer,
            inner: inner.clone(),
        };
        spawn(async move { inner.round(&key, owner, ttl, label.as_deref(), reply).await });
        (&mut delivery.answer)
            .await
            .unwrap_or_else(|_| Err(LockError::backend("the Redlock round task panicked")))
    }
}

/// The caller's end of a round's answer. Dropped unread (the caller's future was dropped
/// after the round had delivered, or while it was on its way), it closes the channel, so
/// the round releases a lease it delivers from then on, and releases on every node a
/// lease already delivered, which nobody will ever hold.
struct Delivery {
    answer: oneshot::Receiver<Result<Option<Lease>, LockError>>,
    inner: Arc<Inner>,
}

impl Drop for Delivery {
    fn drop(&mut self) {
        self.answer.close();
        if let Ok(Ok(Some(orphan))) = self.answer.try_recv() {
            if tokio::runtime::Handle::try_current().is_ok() {
                let limit = self.inner.config.node_timeout_for(orphan.ttl());
                drop(
                    self.inner
                        .release_everywhere(orphan.key(), orphan.owner(), limit)
                        .0,
                );
            }
        }
    }
}
