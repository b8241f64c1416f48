//! The holders of a key as they change ([`DistributedLock::holder_changes`]): the key's
//! queue read once, then followed event by event with a watch from the revision read, so
//! every head of the queue — every holder, as the server saw it — is seen, in order,
//! however briefly it held. Of readers holding together, only the oldest is the head: a
//! reader that comes and goes behind another is not seen.
//!
//! The revision the feed has seen up to moves with each event and, while the queue is
//! quiet, with the progress the server confirms every [`PROGRESS_EVERY`]: so after a
//! broken watch it resumes from a recent revision, which a compaction has most likely
//! left alone (only if it has not does the feed read the queue afresh, and may miss what
//! happened in between).
//!
//! [`DistributedLock::holder_changes`]: tenure_api::DistributedLock::holder_changes

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use etcd_client::{EventType, GetOptions, SortOrder, SortTarget, WatchOptions, WatchStream};
use tenure_api::backend::FeedSource;
use tenure_api::{async_trait, FencingToken, HolderFeed, HolderInfo, LockError};

use crate::rpc::{convert, Rpc};

/// How often a quiet watch asks the server how far it has caught up.
const PROGRESS_EVERY: Duration = Duration::from_secs(30);

/// A key's holders, as a stream (see the module docs).
pub(crate) fn holder_feed(rpc: Rpc, prefix: String) -> HolderFeed {
    let feed = Feed {
        rpc,
        prefix,
        queue: BTreeMap::new(),
        revision: None,
        watch: None,
        shown: None,
        ready: VecDeque::new(),
    };
    tenure_api::backend::holder_feed(feed)
}

struct Feed {
    rpc: Rpc,
    /// The key's queue prefix.
    prefix: String,
    /// The queue as of `revision`: create revision → (key, value).
    queue: BTreeMap<i64, (Vec<u8>, Vec<u8>)>,
    /// The last revision the queue reflects (`None` before the first reading).
    revision: Option<i64>,
    watch: Option<WatchStream>,
    /// The head last given (`None` before the first; `Some(None)`: vacant).
    shown: Option<Option<i64>>,
    /// Readings not yet given.
    ready: VecDeque<Result<Option<HolderInfo>, LockError>>,
}

#[async_trait]
impl FeedSource for Feed {
    fn pop_ready(&mut self) -> Option<Result<Option<HolderInfo>, LockError>> {
        self.ready.pop_front()
    }

    fn restart(&mut self) {
        self.watch = None;
    }

    /// Reads the queue or the watch's next message, queueing any change of holder.
    async fn step(&mut self) -> Result<(), LockError> {
        let Some(watch) = self.watch.as_mut() else {
            return self.start().await;
        };
        let config = &self.rpc.config;
        let message = tokio::select! {
            message = watch.message() => Some(message),
            _ = tokio::time::sleep(PROGRESS_EVERY) => None,
        };
        let Some(message) = message else {
            // Quiet for a while: ask for a progress report (answered once caught up).
            return watch
                .request_progress()
                .await
                .map_err(|e| convert(config, "holder watch progress", e));
        };
        let message = message
            .map_err(|e| convert(config, "holder watch", e))?
            .ok_or_else(|| self.rpc.unavailable("holder watch: the stream ended"))?;
        if message.canceled() {
            self.watch = None;
            if message.compact_revision() > 0 {
                // The revisions after ours were compacted away: read the queue afresh.
                self.revision = None;
                return Ok(());
            }
            return Err(self.rpc.unavailable(&format!(
                "holder watch cancelled: {}",
                message.cancel_reason()
            )));
        }
        if message.events().is_empty() && !message.created() {
            // A progress report: every revision up to its header's is delivered.
            if let Some(header) = message.header() {
                self.revision = self.revision.max(Some(header.revision()));
            }
            return Ok(());
        }
        let mut events = message.events().iter().filter_map(|e| Some((e, e.kv()?)));
        let mut next = events.next();
        while let Some((event, kv)) = next {
            match event.event_type() {
                EventType::Put => {
                    let entry = (kv.key().to_vec(), kv.value().to_vec());
                    self.queue.insert(kv.create_revision(), entry);
                }
                EventType::Delete => self.queue.retain(|_, (key, _)| key != kv.key()),
            }
            self.revision = Some(kv.mod_revision());
            next = events.next();
            // A revision's events all apply at once: its head counts, not one in between.
            if next.is_none_or(|(_, after)| after.mod_revision() != kv.mod_revision()) {
                self.give_head();
            }
        }
        Ok(())
    }
}

impl Feed {
    /// Reads the queue (the first time, or after a compaction), then watches it from the
    /// revision after the one it reflects.
    async fn start(&mut self) -> Result<(), LockError> {
        let revision = match self.revision {
            Some(revision) => revision,
            None => {
                let options = GetOptions::new()
                    .with_prefix()
                    .with_sort(SortTarget::Create, SortOrder::Ascend);
                let reply = self.rpc.get("holder get", &self.prefix, options).await?;
                self.queue = reply
                    .kvs()
                    .iter()
                    .map(|kv| {
                        let entry = (kv.key().to_vec(), kv.value().to_vec());
                        (kv.create_revision(), entry)
                    })
                    .collect();
                let revision = reply.header().map_or(0, |h| h.revision());
                self.revision = Some(revision);
                self.give_head();
                revision
            }
        };
        let options = WatchOptions::new()
            .with_prefix()
            .with_start_revision(revision + 1);
        let watch = || {
            let mut watches = self.rpc.client.watch_client();
            let (prefix, options) = (self.prefix.clone(), options.clone());
            async move { watches.watch(prefix, Some(options)).await }
        };
        self.watch = Some(self.rpc.call("holder watch", watch).await?);
        Ok(())
    }

    /// Queues the queue's head if it changed since the last one given.
    fn give_head(&mut self) {
        let head = self.queue.iter().next();
        let revision = head.map(|(revision, _)| *revision);
        if self.shown == Some(revision) {
            return;
        }
        self.shown = Some(revision);
        self.ready.push_back(match head {
            None => Ok(None),
            Some((&revision, (key, value))) => holder(revision, key, value),
        });
    }
}

/// The holder recorded in the queue entry `key` created at `revision` with `value`.
fn holder(revision: i64, key: &[u8], value: &[u8]) -> Result<Option<HolderInfo>, LockError> {
    let holder = crate::entry::recorded(key, value)?;
    let token = u64::try_from(revision)
        .map_err(|_| LockError::backend(format!("create revision {revision}")))?;
    Ok(Some(HolderInfo {
        owner: holder.owner,
        token: Some(FencingToken(token)),
        remaining: None,
        label: holder.label,
        foreign: holder.foreign,
    }))
}
