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

use crate::error::Error;
use ebs_node_core::format::FormatError;
use ebs_node_core::request::ValidationError;
use ebs_node_host::fstools::FsToolError;

/// The one mapping from domain errors to the codes the CSI spec names.
pub fn to_status(err: &Error) -> Status {
    let code = match err {
        Error::Invalid(ValidationError::Unsupported(_)) => Code::FailedPrecondition,
        Error::Invalid(_) => Code::InvalidArgument,
        Error::VolumeNotFound(_) | Error::PathNotFound { .. } | Error::NotFound(_) => {
            Code::NotFound
        }
        Error::Busy(_) | Error::Aborted(_) | Error::DeviceBusy { .. } => Code::Aborted,
        Error::AlreadyExists(_)
        | Error::AlreadyStagedAt { .. }
        | Error::StagedWithOtherCapability { .. }
        | Error::PublishedWithOtherArguments { .. }
        | Error::PublishedWithOtherReadonly { .. } => Code::AlreadyExists,
        Error::Precondition(_)
        | Error::ForeignMount { .. }
        | Error::ForeignStaging { .. }
        | Error::NotStaged { .. }
        | Error::StagedElsewhere { .. }
        | Error::StillPublished { .. }
        | Error::DeviceInUse { .. }
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
        Error::OutOfRange(_) => Code::OutOfRange,
        Error::ResourceExhausted(_) => Code::ResourceExhausted,
        Error::Unimplemented(_) => Code::Unimplemented,
        Error::Unavailable(_) => Code::Unavailable,
        Error::StillMounted { .. }
        | Error::Command(_)
        | Error::Io { .. }
        | Error::Store(_)
        | Error::Internal(_) => Code::Internal,
    };
    Status::new(code, err.to_string())
}

/// A request that failed validation, as its status (the core's error type is not ours to give a
/// `From` impl for tonic's).
pub fn invalid(err: ValidationError) -> Status {
    to_status(&Error::Invalid(err))
}

impl From<Error> for Status {
    fn from(err: Error) -> Self {
        to_status(&err)
    }
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
    result.map_err(Status::from)
}

/// The caller's deadline from the `grpc-timeout` header, if it sent a well-formed one.
pub fn grpc_timeout<T>(req: &tonic::Request<T>) -> Option<Duration> {
    parse_grpc_timeout(req.metadata().get("grpc-timeout")?.to_str().ok()?)
}

/// The gRPC spec's largest TimeoutValue: "a positive integer as ASCII string of at most 8 digits".
const MAX_TIMEOUT_DIGITS: usize = 8;

/// `TimeoutValue TimeoutUnit` as gRPC over HTTP/2 spells it (`100m`, `5S`, `1H`); anything else
/// (a sign, more than 8 digits, an unknown unit) is no deadline rather than a wrapped or
/// panicking multiplication: even 99999999H fits a `Duration`.
pub fn parse_grpc_timeout(raw: &str) -> Option<Duration> {
    let digits = raw.len().checked_sub(1)?;
    let (num, unit) = (raw.get(..digits)?, raw.get(digits..)?);
    if num.is_empty() || num.len() > MAX_TIMEOUT_DIGITS || !num.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let n: u64 = num.parse().ok()?;
    match unit {
        "H" => n.checked_mul(3600).map(Duration::from_secs),
        "M" => n.checked_mul(60).map(Duration::from_secs),
        "S" => Some(Duration::from_secs(n)),
        "m" => Some(Duration::from_millis(n)),
        "u" => Some(Duration::from_micros(n)),
        "n" => Some(Duration::from_nanos(n)),
        _ => None,
    }
}

#[cfg(test)]
mod timeout_tests {
    use super::*;

    #[test]
    fn every_unit() {
        let t = parse_grpc_timeout;
        assert_eq!(t("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(t("3M"), Some(Duration::from_secs(180)));
        assert_eq!(t("5S"), Some(Duration::from_secs(5)));
        assert_eq!(t("250m"), Some(Duration::from_millis(250)));
        assert_eq!(t("7u"), Some(Duration::from_micros(7)));
        assert_eq!(t("9n"), Some(Duration::from_nanos(9)));
        assert_eq!(t("0S"), Some(Duration::ZERO));
    }

    #[test]
    fn eight_digits_at_most() {
        assert_eq!(
            parse_grpc_timeout("99999999H"),
            Some(Duration::from_secs(99_999_999 * 3600))
        );
        assert_eq!(parse_grpc_timeout("100000000m"), None);
    }

    /// Used to overflow `n * 3600` (a panic in debug builds, a wrapped deadline in release).
    #[test]
    fn huge_values_are_no_deadline_not_a_panic() {
        assert_eq!(parse_grpc_timeout("18446744073709551615H"), None);
        assert_eq!(parse_grpc_timeout("5124095576030432M"), None);
        assert_eq!(parse_grpc_timeout("99999999999999999999S"), None);
    }

    #[test]
    fn malformed() {
        for raw in [
            "", "S", "5", "+5S", "-5S", " 5S", "5 S", "5s", "5SS", "0x5S", "5é", "é",
        ] {
            assert_eq!(parse_grpc_timeout(raw), None, "{raw:?}");
        }
    }
}

#[cfg(test)]
mod code_table_tests;
