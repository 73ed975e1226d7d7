use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(
        "state file {path} is corrupt or unreadable ({detail}); the agent will not start on it. \
         Rebuild it from the mount table with `ebs-node-agent recover --from-mounts`, or start \
         empty with `ebs-node-agent recover --reset` (either keeps this file, moved aside)"
    )]
    Corrupt { path: PathBuf, detail: String },
    /// The file could not be opened for writing: nothing says it is damaged.
    #[error(
        "state file {path} cannot be opened for writing ({detail}); nothing says it is damaged, \
         so do not reset it: make it writable again (an immutable attribute, `chattr -i`; its \
         permissions; a read-only filesystem) and start the agent again"
    )]
    Unwritable { path: PathBuf, detail: String },
    #[error(
        "state file {path} is in use by another process (is an agent already running on this \
         state directory?)"
    )]
    Locked { path: PathBuf },
    #[error(
        "state file {path} has schema version {found}, newer than this agent supports \
         ({supported}); run the newer agent, or restore a backup made before the upgrade"
    )]
    NewerSchema {
        path: PathBuf,
        found: u64,
        supported: u64,
    },
    #[error("state file {0} does not exist")]
    Missing(PathBuf),
    #[error(
        "state file {0} was still being created when the agent stopped (a power cut or kill \
         during its first start): it holds no records; the agent sets it aside and starts afresh"
    )]
    Unfinished(PathBuf),
    #[error("the state file was opened read-only")]
    ReadOnly,
    #[error("path {0:?} is not valid UTF-8 and cannot be recorded")]
    NonUtf8Path(PathBuf),
    #[error("a record in the state file cannot be decoded: {0}")]
    Decode(serde_json::Error),
    #[error("a record cannot be encoded: {0}")]
    Encode(serde_json::Error),
    #[error("state store: {op}: {source}")]
    Redb {
        op: &'static str,
        #[source]
        source: redb::Error,
    },
    /// The batch this write was committed in failed (one error, every waiter of the batch).
    #[error("{0}")]
    BatchFailed(#[source] std::sync::Arc<StoreError>),
    #[error("the state-file writer panicked; the batch was abandoned")]
    WriterPanicked,
    #[error("cannot start the state flusher: {0}")]
    Flusher(#[source] std::io::Error),
    #[error("the state file {path} could not be reopened after a failed commit: {detail}")]
    NotReopened { path: PathBuf, detail: String },
    /// A file of the boot log is there but cannot be read whole: it may hold acknowledged writes
    /// the state file lacks, so the agent does not start without them.
    #[error(
        "boot log {path} cannot be read ({detail}); it may hold writes the state file has not \
         made durable (the last run was killed), so the agent will not start without it. Make it \
         a regular file the agent can read again, or remove it to start without those writes"
    )]
    BootLog { path: PathBuf, detail: String },
    /// The boot log's writes do not follow on from the state file's last one.
    #[error(
        "the boot log beside {path} holds writes from ticket {first}, but the state file's last \
         is {applied}: the file was replaced or restored while the log held writes it lacks. \
         Remove {path}.boot-log-0 and -1 to start on the file as it is"
    )]
    BootLogDiverged {
        path: PathBuf,
        first: u64,
        applied: u64,
    },
}

impl StoreError {
    pub(crate) fn open(path: &Path, e: redb::DatabaseError) -> Self {
        match e {
            redb::DatabaseError::DatabaseAlreadyOpen => StoreError::Locked {
                path: path.to_path_buf(),
            },
            redb::DatabaseError::Storage(redb::StorageError::Io(io)) if denied(&io) => {
                StoreError::Unwritable {
                    path: path.to_path_buf(),
                    detail: io.to_string(),
                }
            }
            other => StoreError::Corrupt {
                path: path.to_path_buf(),
                detail: other.to_string(),
            },
        }
    }
}

/// An open refused for want of permission, not for what the file holds (EPERM for an
/// immutable file, EACCES, EROFS).
fn denied(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{PermissionDenied, ReadOnlyFilesystem};
    matches!(e.kind(), PermissionDenied | ReadOnlyFilesystem)
}

/// redb's errors, each named by what the store was doing, the source kept.
macro_rules! redb_from {
    ($($t:ty => $op:literal),*) => {
        $(impl From<$t> for StoreError {
            fn from(e: $t) -> Self {
                StoreError::Redb { op: $op, source: e.into() }
            }
        })*
    };
}

redb_from!(
    redb::TransactionError => "beginning a transaction",
    redb::TableError => "opening a table",
    redb::StorageError => "reading or writing the file",
    redb::CommitError => "committing",
    redb::SetDurabilityError => "setting a commit's durability"
);
