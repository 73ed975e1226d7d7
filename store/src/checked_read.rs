//! A read-only open whose pages come from a checked copy and whose locks are the file's own.
//!
//! redb trusts every page of a read-only open: a damaged page reaches an `unreachable!` or an
//! out-of-bounds index (a panic; an abort in release builds). Only a checked open verifies each
//! page's checksum, and it may repair what it finds (a damaged allocator state is rebuilt,
//! silently), so a file whose copy opened clean could still abort a read-only open of the file
//! itself (rehearsal 71: `unreachable` in `get_allocator_state_table`). The copy's bytes are
//! the ones proven sound: the read-only database reads those, while it takes and holds the
//! file's own locks, so an agent running on the file is still told (`Locked`), and none starts
//! on it while the reader lives.

use std::fs::File;
use std::io;
use std::ops::Bound;
use std::os::unix::fs::FileExt;
use std::path::Path;

use redb::backends::FileBackend;
use redb::{BackendError, StorageBackend};

/// Reads `bytes` (the checked copy), locks `locks` (the file itself); never writes.
#[derive(Debug)]
pub struct CheckedRead {
    locks: FileBackend,
    bytes: File,
}

impl CheckedRead {
    pub fn new(file: &Path, checked_copy: &Path) -> Result<Self, redb::DatabaseError> {
        let locks = FileBackend::new(File::open(file)?)?;
        Ok(CheckedRead {
            locks,
            bytes: File::open(checked_copy)?,
        })
    }
}

fn read_only() -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        "a read-only open never writes",
    )
}

impl StorageBackend for CheckedRead {
    fn len(&self) -> Result<u64, io::Error> {
        Ok(self.bytes.metadata()?.len())
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        self.bytes.read_exact_at(out, offset)
    }

    fn set_len(&self, _len: u64) -> Result<(), io::Error> {
        Err(read_only())
    }

    fn sync_data(&self) -> Result<(), io::Error> {
        Err(read_only())
    }

    fn write(&self, _offset: u64, _data: &[u8]) -> Result<(), io::Error> {
        Err(read_only())
    }

    fn close(&self) -> Result<(), io::Error> {
        self.locks.close()
    }

    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.locks.try_lock_range(start, end)
    }

    fn try_lock_shared_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<bool, BackendError> {
        self.locks.try_lock_shared_range(start, end)
    }

    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.locks.lock_range(start, end)
    }

    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.locks.lock_shared_range(start, end)
    }

    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.locks.unlock_range(start, end)
    }

    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.locks.query_lock_range(start, end)
    }
}
