//! The thin gRPC layer: requests become typed commands, domain errors become one `tonic::Status`
//! each, here and nowhere else.

pub mod addons;
pub mod admin;
pub mod capability;
pub mod controller;
pub mod identity;
mod loop_snapshots;
pub mod node;
mod node_stats;
pub mod shim;
pub mod spec_order;
pub mod v0;
pub mod v01;
pub mod versions;

use std::future::Future;
use std::time::{Duration, Instant};

use tonic::{Code, Status};

use ebs_node_core::error::{CapacityError, ControllerError, Error};
use ebs_node_core::format::FormatError;
use ebs_node_core::request::ValidationError;
use ebs_node_core::seam::FsToolError;

/// The one mapping from domain errors to the codes the CSI spec names.
pub fn to_status(err: &Error) -> Status {
    let code = match err {
        Error::Invalid(ValidationError::Unsupported(_)) => Code::FailedPrecondition,
        Error::Invalid(_) => Code::InvalidArgument,
        Error::VolumeNotFound(_)
        | Error::PathNotFound { .. }
        | Error::StagedVolumeNotFound { .. }
        | Error::DeviceNotAttached { .. }
        | Error::NotAnEbsVolumeId { .. }
        | Error::DeviceNotAppeared { .. }
        | Error::NoSuchDisk { .. } => Code::NotFound,
        Error::Busy(_)
        | Error::StatsInFlight { .. }
        | Error::OperationPending { .. }
        | Error::PathBusy { .. }
        | Error::DeviceBusy { .. } => Code::Aborted,
        Error::AlreadyStagedAt { .. }
        | Error::StagedWithOtherCapability { .. }
        | Error::PublishedWithOtherArguments { .. }
        | Error::PublishedWithOtherReadonly { .. }
        | Error::MountedNotAsMade { .. } => Code::AlreadyExists,
        Error::StagingPathRequired
        | Error::NodeIdentityUnknown { .. }
        | Error::ReadOnlyDeviceDidNotFollow { .. }
        | Error::ForeignMount { .. }
        | Error::ForeignStaging { .. }
        | Error::NotStaged { .. }
        | Error::StagedElsewhere { .. }
        | Error::StillPublished { .. }
        | Error::DeviceInUse { .. }
        | Error::BytesInUseElsewhere { .. }
        | Error::DeviceStillBound { .. }
        | Error::StagedForOtherAccess { .. }
        | Error::SinglePublication { .. }
        | Error::NoLongerTheDevice { .. }
        | Error::StagingEmpty { .. }
        | Error::UnusableTarget { .. }
        | Error::CoveredMount { .. }
        | Error::FilesystemInUse { .. }
        | Error::StagingChanged { .. }
        | Error::MountUnreadable { .. }
        | Error::PathUnexaminable { .. }
        | Error::TargetNotCreated { .. }
        | Error::StagingNotCreated { .. }
        | Error::PathOfAnotherVolume { .. }
        | Error::StagingIncomplete { .. }
        | Error::NotTheVolumeAnyMore { .. }
        | Error::GrowNeedsCapability { .. }
        | Error::StagingNotMounted { .. }
        | Error::MountedReadOnly { .. }
        | Error::ReadOnlyNoDiscard { .. }
        | Error::NeedsAttention { .. }
        | Error::VolumeInUse { .. }
        | Error::StillAttached { .. }
        | Error::AttachedElsewhere { .. }
        | Error::NotAttached { .. }
        | Error::IndistinctDevice { .. }
        | Error::HostDisk { .. }
        | Error::DiskClaimed { .. }
        | Error::DeviceClaimed { .. }
        | Error::AnotherAgentsDevice { .. }
        | Error::AmbiguousSerial { .. }
        | Error::WrongDevice { .. } => Code::FailedPrecondition,
        // Every variant named, so that a new one is given its code here, not by default.
        Error::Format(e) => match e {
            FormatError::NotBlank { .. }
            | FormatError::WrongDevice { .. }
            | FormatError::NothingToMount { .. }
            | FormatError::EmptyDevice { .. }
            | FormatError::Unprovable { .. } => Code::FailedPrecondition,
            FormatError::Io { .. } => Code::Internal,
        },
        Error::FsTool(e) => match e {
            FsToolError::Unavailable { .. } | FsToolError::FsckFailed { .. } => {
                Code::FailedPrecondition
            }
            FsToolError::DoesNotFit { .. } => Code::OutOfRange,
            FsToolError::ToolFailed { .. }
            | FsToolError::Sizing { .. }
            | FsToolError::NonUtf8Path(_)
            | FsToolError::Command(_) => Code::Internal,
        },
        Error::Controller(e) => controller_code(e),
        Error::Capacity(e) => match e {
            CapacityError::RequiredOverLimit { .. }
            | CapacityError::WouldShrink { .. }
            | CapacityError::BeyondFileSize { .. }
            | CapacityError::NoAlignedSize { .. }
            | CapacityError::SmallerThanSource { .. }
            | CapacityError::BelowMinimum { .. }
            | CapacityError::BeyondInt64 { .. }
            | CapacityError::FilesystemLimit { .. }
            | CapacityError::FileTooLarge { .. }
            | CapacityError::DeviceNotGrown { .. }
            | CapacityError::DeviceOverLimit { .. } => Code::OutOfRange,
        },
        Error::ReclaimOfBlockVolume { .. }
        | Error::DiscardUnsupported { .. }
        | Error::TrimUnimplemented { .. } => Code::Unimplemented,
        Error::Starting | Error::BeingChecked { .. } | Error::BindsUnknown { .. } => {
            Code::Unavailable
        }
        Error::StillMounted { .. }
        | Error::Command(_)
        | Error::Io { .. }
        | Error::Store(_)
        | Error::LoopDevice { .. }
        | Error::Probe { .. }
        | Error::ReadOnlyDeviceChanged { .. }
        | Error::AllocationUnreadable { .. }
        | Error::DamagedRecord { .. }
        | Error::BlockingTaskFailed { .. }
        | Error::Panicked { .. } => Code::Internal,
    };
    Status::new(code, err.to_string())
}

/// The controller side's codes, as the CSI spec gives them.
fn controller_code(err: &ControllerError) -> Code {
    match err {
        ControllerError::SnapshotNotFound { .. }
        | ControllerError::SourceNotFound { .. }
        | ControllerError::UnknownNode { .. } => Code::NotFound,
        ControllerError::UnknownStartingToken { .. }
        | ControllerError::DeviceOfVolumeBusy { .. } => Code::Aborted,
        ControllerError::SnapshotNameTaken { .. }
        | ControllerError::VolumeNameTaken { .. }
        | ControllerError::AttachedWithOtherReadonly { .. } => Code::AlreadyExists,
        ControllerError::AttachLimitReached { .. } | ControllerError::NoSpace { .. } => {
            Code::ResourceExhausted
        }
        ControllerError::SourceNotReady { .. } | ControllerError::CannotFreeze { .. } => {
            Code::Unavailable
        }
    }
}

/// A request that failed validation, as its status (the core's error type is not ours to give a
/// `From` impl for tonic's).
pub fn invalid(err: ValidationError) -> Status {
    to_status(&Error::Invalid(err))
}

/// Runs one RPC and logs one line for it: the call, its volume, duration and result.
pub async fn logged<T, F>(rpc: &'static str, volume: &str, fut: F) -> Result<T, Status>
where
    F: Future<Output = Result<T, Error>>,
{
    let started = Instant::now();
    let result = fut.await;
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    crate::metrics::observe_rpc(rpc, result.as_ref().err().map(|e| to_status(e).code()), ms);
    // A number in JSON logs, two decimals in text ones.
    let ms = (ms * 100.0).round() / 100.0;
    match &result {
        Ok(_) => tracing::info!(rpc, volume, ms, "ok"),
        Err(e) => {
            let st = to_status(e);
            tracing::warn!(rpc, volume, ms, code = ?st.code(), error = %e, "failed");
        }
    }
    result.map_err(|e| to_status(&e))
}

/// The caller's deadline from the `grpc-timeout` header, if it sent a well-formed one.
pub fn grpc_timeout<T>(req: &tonic::Request<T>) -> Option<Duration> {
    ebs_node_core::deadline::parse_grpc_timeout(req.metadata().get("grpc-timeout")?.to_str().ok()?)
}

#[cfg(test)]
mod code_table_tests;

#[cfg(test)]
mod error_codes_tests;
#[cfg(test)]
mod node_tables;
