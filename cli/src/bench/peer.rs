//! Peers: another library's lock on the same servers, run with `--peers` interleaved with
//! tenure (and its floor), so that "as fast as the library users would otherwise pick" is
//! measured in the same run. Each backend's testbed names its peer, if it has one
//! (`Testbed::peer`): today ZooKeeper's, zookeeper-client's own lock recipe (`recipe`);
//! the other backends' Rust peers are separate crates this project does not depend on.
//! A peer is a lock: not with `--permits` or `--election`.

use std::sync::Arc;

use tenure_api::LockError;

use super::{Locker, Mode};
use crate::local;

/// The peer lockers for `url` in `mode` (16 clients for `contended`, as for tenure, else
/// one) and the peer's name; `None` for a backend without a peer.
pub(super) async fn lockers(
    url: &str,
    mode: Mode,
) -> Result<Option<(Vec<Arc<dyn Locker>>, &'static str)>, LockError> {
    let backend = tenure::driver_for(url)?.name;
    let Some((name, connect)) = local::testbed(backend).and_then(|testbed| testbed.peer) else {
        return Ok(None);
    };
    let mut lockers: Vec<Arc<dyn Locker>> = Vec::with_capacity(mode.clients());
    for _ in 0..mode.clients() {
        lockers.push(connect(url).await?);
    }
    Ok(Some((lockers, name)))
}
