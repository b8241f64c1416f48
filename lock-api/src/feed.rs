//! The driver of a backend's [`HolderFeed`]: what the etcd and ZooKeeper feeds share.

use std::time::Duration;

use async_trait::async_trait;
use futures::stream::{self, StreamExt};

use crate::{HolderFeed, HolderInfo, LockError};

/// How long a feed waits after a failed step before the next, doubled after each further
/// failure up to [`MAX_RETRY_PAUSE`].
const RETRY_PAUSE: Duration = Duration::from_millis(500);
const MAX_RETRY_PAUSE: Duration = Duration::from_secs(10);

/// A backend's source of holder readings, for [`holder_feed`]: it reads or follows the
/// key's holders step by step and queues each change it sees.
#[async_trait]
pub trait FeedSource: Send + 'static {
    /// The next reading queued by an earlier step, if any.
    fn pop_ready(&mut self) -> Option<Result<Option<HolderInfo>, LockError>>;

    /// One step: a reading, or one message of a watch, queueing any change of holder.
    /// A failed step is given as an `Err` item.
    ///
    /// # Cancel safety
    /// Dropping the feed drops the step.
    async fn step(&mut self) -> Result<(), LockError>;

    /// After a failed step: forget any watch, so that the next step starts afresh.
    fn restart(&mut self);
}

/// A [`HolderFeed`] over `source`: its queued readings in order; after a failed step,
/// the error, then the next step after a pause (500 ms, doubled after each further
/// failure up to 10 s).
pub fn holder_feed<S: FeedSource>(source: S) -> HolderFeed {
    stream::unfold((source, 0u32), |(mut source, mut failures)| async move {
        loop {
            if let Some(item) = source.pop_ready() {
                return Some((item, (source, failures)));
            }
            if failures > 0 {
                let doublings = (failures - 1).min(5);
                let pause = (RETRY_PAUSE * 2u32.pow(doublings)).min(MAX_RETRY_PAUSE);
                tokio::time::sleep(pause).await;
            }
            match source.step().await {
                Ok(()) => failures = 0,
                Err(e) => {
                    source.restart();
                    failures = failures.saturating_add(1);
                    return Some((Err(e), (source, failures)));
                }
            }
        }
    })
    .boxed()
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::{Arc, Mutex};

    use tokio::time::Instant;

    use super::*;
    use crate::OwnerId;

    /// When each step ran, and how many restarts came before it.
    type Log = Arc<Mutex<Vec<(Instant, usize)>>>;

    /// Fails its first `failing` steps, then queues one holder per step.
    struct Scripted {
        failing: usize,
        restarts: usize,
        log: Log,
        ready: VecDeque<Result<Option<HolderInfo>, LockError>>,
    }

    #[async_trait]
    impl FeedSource for Scripted {
        fn pop_ready(&mut self) -> Option<Result<Option<HolderInfo>, LockError>> {
            self.ready.pop_front()
        }

        async fn step(&mut self) -> Result<(), LockError> {
            let mut log = self.log.lock().unwrap();
            log.push((Instant::now(), self.restarts));
            if log.len() <= self.failing {
                return Err(LockError::backend("scripted failure"));
            }
            let holder = HolderInfo {
                owner: OwnerId([1; 16]),
                token: None,
                remaining: None,
                label: None,
                foreign: false,
            };
            self.ready.push_back(Ok(Some(holder)));
            Ok(())
        }

        fn restart(&mut self) {
            self.restarts += 1;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn failed_steps_are_items_and_the_next_waits_longer_each_time() {
        let log = Log::default();
        let mut feed = holder_feed(Scripted {
            failing: 3,
            restarts: 0,
            log: log.clone(),
            ready: VecDeque::new(),
        });
        for _ in 0..3 {
            assert!(feed.next().await.unwrap().is_err());
        }
        assert!(feed.next().await.unwrap().unwrap().is_some());
        let log = log.lock().unwrap().clone();
        let gaps: Vec<Duration> = log.windows(2).map(|w| w[1].0 - w[0].0).collect();
        assert_eq!(
            gaps,
            [500, 1000, 2000].map(Duration::from_millis),
            "pauses after 1, 2 and 3 failures"
        );
        let restarts: Vec<usize> = log.iter().map(|(_, r)| *r).collect();
        assert_eq!(restarts, [0, 1, 2, 3], "a restart after each failure");
    }
}
