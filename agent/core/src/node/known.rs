//! Whether a volume is known here, for the NOT_FOUND that the CSI spec puts before any check of
//! a path or a state (see the daemon's `grpc::spec_order`,
//! agent/daemon/src/grpc/spec_order.rs).

use super::NodeCtx;
use crate::error::{Error, Result};
use crate::request::VolumeId;

/// Whose word decides that a volume exists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Known {
    /// The backend's records (loop volume files). A backend that cannot tell without waiting
    /// for a device (EBS: the device appears when it appears) lets the call go on.
    ByBackend,
    /// Staged on this node: stats and expansion ask about a place where the volume already is.
    StagedHere,
}

/// `VolumeNotFound` unless the volume is known in the given sense. Reads records only: no
/// path of the request is touched.
pub fn require_known(ctx: &NodeCtx, volume: &VolumeId, known: Known) -> Result<()> {
    let found = match known {
        Known::ByBackend => ctx.backend.exists(volume)?.unwrap_or(true),
        Known::StagedHere => ctx.ledger.staged(volume.as_str())?.is_some(),
    };
    if found {
        Ok(())
    } else {
        Err(Error::VolumeNotFound(volume.to_string()))
    }
}
