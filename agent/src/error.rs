//! The one domain error enum. Domain code returns it; `grpc::to_status` maps it to a gRPC code in one
//! place, so the CSI-specified codes are decided once.

use std::path::PathBuf;

use ebs_node_core::format::FormatError;
use ebs_node_core::request::ValidationError;
use ebs_node_host::command::CommandError;
use ebs_node_host::fstools::FsToolError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    #[error("volume {0} does not exist")]
    VolumeNotFound(String),
    #[error("nothing of volume {volume} is at {path}")]
    PathNotFound { volume: String, path: PathBuf },
    #[error("{0}")]
    NotFound(String),
    #[error("another operation on volume {0} is in progress; retry later")]
    Busy(String),
    #[error("{0}")]
    Aborted(String),
    #[error("{0}")]
    AlreadyExists(String),
    #[error("{0}")]
    Precondition(String),
    #[error(
        "refusing to format {device}: it is not blank ({found}); the agent formats only devices \
         that carry no signature and no data"
    )]
    NotBlank { device: PathBuf, found: String },
    #[error(
        "refusing to use {device} for volume {volume}: {reason}; nothing was formatted or mounted"
    )]
    WrongDevice {
        volume: String,
        device: PathBuf,
        reason: String,
    },
    #[error(
        "filesystem check of {device} failed (e2fsck exit {code}): {summary}; the volume was not \
         mounted, repair it by hand"
    )]
    FsckFailed {
        device: PathBuf,
        code: i32,
        summary: String,
    },
    #[error("{tool} on {device} failed (exit {code}): {stderr}")]
    ToolFailed {
        tool: String,
        device: PathBuf,
        code: i32,
        stderr: String,
    },
    #[error("filesystem {0} is not available on this host: {1}")]
    FsUnavailable(String, String),
    #[error("{0}")]
    OutOfRange(String),
    #[error("{0}")]
    ResourceExhausted(String),
    #[error("{0}")]
    Unimplemented(String),
    #[error("{0}")]
    Unavailable(String),
    #[error(transparent)]
    Command(#[from] CommandError),
    #[error("{context}: {source}")]
    Io {
        context: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Store(#[from] ebs_store::StoreError),
    #[error("internal error: {0}")]
    Internal(String),
}

impl Error {
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }
}

/// The host's words for a filesystem tool's failure, as the domain's: the same messages, and
/// `grpc::to_status` chooses their codes.
impl From<FsToolError> for Error {
    fn from(e: FsToolError) -> Self {
        match e {
            FsToolError::Unavailable { fs, why } => Error::FsUnavailable(fs.name().into(), why),
            FsToolError::FsckFailed {
                device,
                code,
                summary,
            } => Error::FsckFailed {
                device,
                code,
                summary,
            },
            FsToolError::ToolFailed {
                tool,
                device,
                code,
                stderr,
            } => Error::ToolFailed {
                tool,
                device,
                code,
                stderr,
            },
            e @ FsToolError::DoesNotFit { .. } => Error::OutOfRange(e.to_string()),
            FsToolError::Sizing { device, source } => {
                Error::io(format!("sizing {}", device.display()), source)
            }
            e @ FsToolError::NonUtf8Path(_) => Error::Internal(e.to_string()),
            FsToolError::Command(e) => Error::Command(e),
        }
    }
}

/// The never-format rule's refusals, as the domain's: the same messages as before the rule
/// moved to the core.
impl From<FormatError> for Error {
    fn from(e: FormatError) -> Self {
        match e {
            FormatError::NotBlank { device, found } => Error::NotBlank { device, found },
            FormatError::WrongDevice {
                volume,
                device,
                reason,
            } => Error::WrongDevice {
                volume,
                device,
                reason,
            },
            e @ (FormatError::NothingToMount { .. }
            | FormatError::EmptyDevice { .. }
            | FormatError::Unprovable { .. }) => Error::Precondition(e.to_string()),
            FormatError::Io { context, source } => Error::Io { context, source },
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Runs blocking host work off the async executor and flattens the join error.
pub async fn blocking<T, F>(f: F) -> Result<T>
where
    F: FnOnce() -> Result<T> + Send + 'static,
    T: Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::Internal(format!("blocking task failed: {e}")))?
}
