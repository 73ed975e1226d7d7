//! The thin gRPC layer: requests become typed commands, domain errors become one `tonic::Status`
//! each, here and nowhere else.

pub mod addons;
pub mod admin;
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
use crate::request::ValidationError;

/// The one mapping from domain errors to the codes the CSI spec names.
pub fn status(err: &Error) -> Status {
    let code = match err {
        Error::Invalid(ValidationError::Unsupported(_)) => Code::FailedPrecondition,
        Error::Invalid(_) => Code::InvalidArgument,
        Error::VolumeNotFound(_) | Error::PathNotFound { .. } | Error::NotFound(_) => {
            Code::NotFound
        }
        Error::Busy(_) | Error::Aborted(_) => Code::Aborted,
        Error::AlreadyExists(_) => Code::AlreadyExists,
        Error::Precondition(_)
        | Error::NotBlank { .. }
        | Error::WrongDevice { .. }
        | Error::FsckFailed { .. }
        | Error::FsUnavailable(..) => Code::FailedPrecondition,
        Error::OutOfRange(_) => Code::OutOfRange,
        Error::ResourceExhausted(_) => Code::ResourceExhausted,
        Error::Unimplemented(_) => Code::Unimplemented,
        Error::Unavailable(_) => Code::Unavailable,
        Error::ToolFailed { .. }
        | Error::Command(_)
        | Error::Io { .. }
        | Error::Store(_)
        | Error::Internal(_) => Code::Internal,
    };
    Status::new(code, err.to_string())
}

impl From<Error> for Status {
    fn from(err: Error) -> Self {
        status(&err)
    }
}

impl From<ValidationError> for Status {
    fn from(err: ValidationError) -> Self {
        status(&Error::Invalid(err))
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
    crate::metrics::observe_rpc(rpc, result.as_ref().err().map(|e| status(e).code()), ms);
    // A number in JSON logs, two decimals in text ones.
    let ms = (ms * 100.0).round() / 100.0;
    match &result {
        Ok(_) => tracing::info!(rpc, volume, ms, "ok"),
        Err(e) => {
            let st = status(e);
            tracing::warn!(rpc, volume, ms, code = ?st.code(), error = %e, "failed");
        }
    }
    result.map_err(Status::from)
}

/// The caller's deadline from the `grpc-timeout` header, if it sent one.
pub fn grpc_timeout<T>(req: &tonic::Request<T>) -> Option<Duration> {
    let raw = req.metadata().get("grpc-timeout")?.to_str().ok()?;
    let (num, unit) = raw.split_at(raw.len().checked_sub(1)?);
    let n: u64 = num.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}
