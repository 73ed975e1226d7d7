//! Which CSI versions the socket serves (`--csi-versions`). The v1 services are built once;
//! the v0.3 and v0.1 services are adapters around those very instances, so every version shares
//! one set of volume guards, one store and one pipeline per operation.

use std::path::Path;
use std::sync::Arc;

use crate::connections::Router;
use ebs_proto::csi::{self as v01, v0, v1};
use v1::controller_server::Controller;

use super::controller::LoopControllerService;
use super::identity::IdentityService;
use super::node::NodeService;
use super::shim::ControllerShim;
use super::{v0 as a0, v01 as a01};
use crate::settings::CsiVersion;

/// The v1 services this process runs; `None` where its mode or backend serves none.
pub struct Services {
    pub identity: Arc<IdentityService>,
    pub node: Option<Arc<NodeService>>,
    pub loop_controller: Option<Arc<LoopControllerService>>,
    pub shim: Option<Arc<ControllerShim>>,
}

pub fn names(versions: &[CsiVersion]) -> Vec<&'static str> {
    versions
        .iter()
        .map(|v| match v {
            CsiVersion::V1 => "v1",
            CsiVersion::V0 => "v0",
            CsiVersion::V01 => "v0.1",
        })
        .collect()
}

pub fn check(versions: &[CsiVersion]) -> Result<(), String> {
    if versions.is_empty() {
        return Err("--csi-versions: name at least one of v1, v0, v0.1".into());
    }
    Ok(())
}

/// Adds the services of each enabled version. `state_dir` holds v0.1's internal staging.
pub fn add_services(
    mut router: Router,
    versions: &[CsiVersion],
    s: Services,
    state_dir: &Path,
) -> Router {
    let on = |v: CsiVersion| versions.contains(&v);
    let controller: Option<Arc<dyn Controller>> = match (&s.shim, &s.loop_controller) {
        (Some(shim), _) => Some(Arc::clone(shim) as Arc<dyn Controller>),
        (None, Some(c)) => Some(Arc::clone(c) as Arc<dyn Controller>),
        (None, None) => None,
    };

    if on(CsiVersion::V1) {
        router = router.add_service(v1::identity_server::IdentityServer::from_arc(Arc::clone(
            &s.identity,
        )));
        if let Some(node) = &s.node {
            router = router.add_service(v1::node_server::NodeServer::from_arc(Arc::clone(node)));
        }
        if let Some(shim) = &s.shim {
            router = router.add_service(v1::controller_server::ControllerServer::from_arc(
                Arc::clone(shim),
            ));
        } else if let Some(c) = &s.loop_controller {
            router = router.add_service(v1::controller_server::ControllerServer::from_arc(
                Arc::clone(c),
            ));
        }
    }

    if on(CsiVersion::V0) {
        router = router.add_service(v0::identity_server::IdentityServer::new(
            a0::identity::V0Identity {
                v1: Arc::clone(&s.identity),
            },
        ));
        if let Some(node) = &s.node {
            router = router.add_service(v0::node_server::NodeServer::new(a0::node::V0Node {
                v1: Arc::clone(node),
            }));
        }
        if let Some(c) = &controller {
            router = router.add_service(v0::controller_server::ControllerServer::new(
                a0::controller::V0Controller { v1: Arc::clone(c) },
            ));
        }
    }

    if on(CsiVersion::V01) {
        router = router.add_service(v01::identity_server::IdentityServer::new(
            a01::identity::V01Identity {
                v1: Arc::clone(&s.identity),
            },
        ));
        if let Some(node) = &s.node {
            let state_dir = std::path::absolute(state_dir).unwrap_or_else(|_| state_dir.into());
            router = router.add_service(v01::node_server::NodeServer::new(a01::node::V01Node {
                v1: Arc::clone(node),
                identity: Arc::clone(&s.identity),
                staging_root: state_dir.join(a01::node::STAGING_DIR),
                calls: Default::default(),
            }));
        }
        if let Some(c) = &controller {
            router = router.add_service(v01::controller_server::ControllerServer::new(
                a01::controller::V01Controller {
                    v1: Arc::clone(c),
                    identity: Arc::clone(&s.identity),
                },
            ));
        }
    }
    router
}
