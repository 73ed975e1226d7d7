//! CSI v0.1.0 (`package csi`, Mesos 1.5) on the v1 socket. As for v0.3, every call becomes v1
//! calls run through the v1 services; what is particular to v0.1 is translated here:
//! - each request names the protocol version it assumes; anything but 0.1.0 is refused with
//!   INVALID_ARGUMENT, as the v0.1 error scheme asks;
//! - v0.1 has no staging, so NodePublishVolume stages under the agent's state directory first
//!   and NodeUnpublishVolume unstages once the volume's last publication is gone (`node.rs`);
//! - probes carry no readiness flag: a starting agent answers UNAVAILABLE.

pub mod controller;
pub mod identity;
pub mod node;

use ebs_proto::csi as v01;
use ebs_proto::csi::v1::{self, identity_server::Identity as V1Identity};
use tonic::{Request, Status};

use crate::grpc::identity::IdentityService;

/// The only version this plugin speaks under `package csi`.
pub const VERSION: v01::Version = v01::Version {
    major: 0,
    minor: 1,
    patch: 0,
};

/// Refuses a request whose version is missing or not exactly 0.1.0.
pub fn check_version(v: Option<&v01::Version>) -> Result<(), Status> {
    match v {
        Some(v) if *v == VERSION => Ok(()),
        Some(v) => Err(Status::invalid_argument(format!(
            "unsupported CSI version {}.{}.{}: under package csi this plugin speaks 0.1.0 \
             (0.2/0.3 are served as csi.v0, 1.x as csi.v1)",
            v.major, v.minor, v.patch
        ))),
        None => Err(Status::invalid_argument(
            "version is required (this plugin speaks 0.1.0 under package csi)",
        )),
    }
}

/// The v1 Probe as v0.1 understands it: an empty answer means healthy and ready.
pub async fn probe(identity: &IdentityService, req: Request<()>) -> Result<(), Status> {
    let r = identity
        .probe(req.map(|()| v1::ProbeRequest {}))
        .await?
        .into_inner();
    if r.ready == Some(false) {
        return Err(Status::unavailable(
            "the agent is starting (start-up recovery is running); retry shortly",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn only_0_1_0() {
        assert!(check_version(Some(&VERSION)).is_ok());
        for bad in [(0, 2, 0), (0, 1, 1), (1, 0, 0), (0, 0, 0)] {
            let v = v01::Version {
                major: bad.0,
                minor: bad.1,
                patch: bad.2,
            };
            assert_eq!(
                check_version(Some(&v)).unwrap_err().code(),
                Code::InvalidArgument
            );
        }
        assert_eq!(
            check_version(None).unwrap_err().code(),
            Code::InvalidArgument
        );
    }
}
