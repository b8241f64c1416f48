//! A key's gate, `<stem>.gate`: two one-byte locks that make the key's read-write lock
//! writer-preferring and its readers' tokens rise.
//!
//! - Byte 0, **a writer waits**: a writer whose first attempt failed holds it exclusively
//!   while it waits ([`WaitingWriter`]), until it holds the key or stops waiting. A reader
//!   asks whether anyone holds it ([`writer_waits`]) before it takes the key, without
//!   taking it, so readers never keep a writer from saying it waits; a reader that asks
//!   after a writer said so waits behind it. (One that asked just before may still take the
//!   key: the writer then waits for that one reader's lease, not for a stream of them.)
//! - Byte 1, **the record**: a reader holds it exclusively while it takes the key and
//!   records its grant ([`RecordTurn`]): readers hold the key together, so they take turns
//!   at the state file's counter. Writers record under the key's exclusive lock, which no
//!   reader holds meanwhile.

use std::fs::File;
use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::ofd::{self, Mode, Span};

const WRITER_WAITS: Span = Span::Byte(0);
const RECORD: Span = Span::Byte(1);

/// Whether a writer waits for the key whose gate is `path` (a missing gate: none).
pub(crate) fn writer_waits(path: &Path) -> io::Result<bool> {
    let gate = match ofd::open_existing(path) {
        Ok(gate) => gate,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    ofd::conflicts(&gate, Mode::Shared, WRITER_WAITS)
}

/// A writer's place at the gate: readers that come after it wait until it is dropped.
#[derive(Debug)]
pub(crate) struct WaitingWriter {
    _locked: File,
}

impl WaitingWriter {
    /// Says a writer waits at the gate `path`: `None` if another writer already does (the
    /// readers are held back all the same).
    pub(crate) fn try_enter(path: &Path) -> io::Result<Option<Self>> {
        let file = ofd::open(path)?;
        Ok(ofd::lock(&file, Mode::Exclusive, WRITER_WAITS)?.then_some(Self { _locked: file }))
    }
}

/// A reader's turn at the record: no other reader records meanwhile. Given up when dropped.
#[derive(Debug)]
pub(crate) struct RecordTurn {
    _locked: File,
}

impl RecordTurn {
    /// Takes the turn at the gate `path`, trying again every millisecond or so while
    /// another reader has it (for as long as writing and flushing one record): `None` if
    /// it is still taken after `patience` (its reader stopped midway, say). Never waits in
    /// the kernel, so a stopped reader cannot hold this thread.
    pub(crate) fn take(path: &Path, patience: Duration) -> io::Result<Option<Self>> {
        let file = ofd::open(path)?;
        let started = Instant::now();
        while !ofd::lock(&file, Mode::Exclusive, RECORD)? {
            if started.elapsed() >= patience {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(Some(Self { _locked: file }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_waiting_writer_is_seen_until_it_leaves() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k.gate");
        assert!(!writer_waits(&path).unwrap());
        assert!(!path.exists(), "asking makes no gate");
        let writer = WaitingWriter::try_enter(&path).unwrap().expect("first");
        assert!(writer_waits(&path).unwrap());
        assert!(WaitingWriter::try_enter(&path).unwrap().is_none(), "second");
        let turn = RecordTurn::take(&path, Duration::ZERO)
            .unwrap()
            .expect("free");
        assert!(writer_waits(&path).unwrap(), "the record is another byte");
        let started = Instant::now();
        let patience = Duration::from_millis(20);
        assert!(
            RecordTurn::take(&path, patience).unwrap().is_none(),
            "taken"
        );
        assert!(started.elapsed() >= patience);
        drop((writer, turn));
        assert!(!writer_waits(&path).unwrap());
        assert!(RecordTurn::take(&path, Duration::ZERO).unwrap().is_some());
    }
}
