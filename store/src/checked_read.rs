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
//!
//! The locks come first: a reader over an empty database's bytes takes them (`hold_locks`)
//! before the file is read at all, so whatever the copy meets after (a damaged file, no memory)
//! never hides an agent that holds the file. The copy is an anonymous memory file: no name for
//! anyone to take first, no temporary directory to depend on (a fifty-seventh fresh review's
//! F2: an unprivileged user who took the copy's predictable name in /tmp turned "in use" into
//! "corrupt", and `recover --reset` moved a live agent's file aside).

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
    pub fn new(file: &Path, bytes: File) -> Result<Self, redb::DatabaseError> {
        let locks = FileBackend::new(open_for_locks(file)?)?;
        Ok(CheckedRead { locks, bytes })
    }
}

/// The file opened only to take its locks: never blocking (a FIFO), nothing read.
fn open_for_locks(file: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
        .open(file)
}

/// A memory file with no name.
pub fn anonymous(name: &str) -> io::Result<File> {
    Ok(rustix::fs::memfd_create(name, rustix::fs::MemfdFlags::CLOEXEC)?.into())
}

/// Takes the read-only locks of the file at `file`, reading none of its bytes (the reader's are
/// an empty database's): `DatabaseAlreadyOpen` while an agent holds it. Held until dropped.
pub fn hold_locks(file: &Path) -> Result<redb::ReadOnlyDatabase, redb::DatabaseError> {
    let empty = anonymous("ebs-node-agent-lock-probe")?;
    let backend = FileBackend::new(empty.try_clone()?)?;
    drop(redb::Database::builder().create_with_backend(backend)?);
    redb::Database::builder().open_read_only_with_backend(CheckedRead::new(file, empty)?)
}

/// `bytes` opened with every page checked (and repaired, if a crash left them so), then closed:
/// while a checked (writable) open holds them, they read as left by a crash.
pub fn check(bytes: &File) -> Result<(), redb::DatabaseError> {
    let db = redb::Database::builder()
        .set_check_integrity_on_open(true)
        .create_with_backend(FileBackend::new(bytes.try_clone()?)?)?;
    drop(db);
    Ok(())
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
