//! What NodeGetInfo answers: the identity is found once at start (or later, in the background),
//! never fetched on the request path; the attach limit is recomputed from sysfs at each call.
//!
//! The `ebs` backend learns the instance from flags, DMI or instance metadata (the daemon's
//! `nodeinfo::sources` runs these readers, in the background, and never crashes for want of
//! them); the loop backend answers with its host name.

pub mod csi_owned;
pub mod dmi;
pub mod host_devices;
pub mod imds;
pub mod live_limit;
pub mod outpost;

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use live_limit::LiveLimit;

use ebs_node_core::error::{Error, Result};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeInfo {
    pub node_id: String,
    pub max_volumes: i64,
    pub topology: HashMap<String, String>,
}

/// What was found, and where the attach limit comes from at each call (`None`: fixed).
type Known = (NodeInfo, Option<Arc<LiveLimit>>);

/// The node's identity, or the hint that tells an operator how to give it.
pub struct NodeInfoSource {
    state: RwLock<std::result::Result<Known, String>>,
}

impl NodeInfoSource {
    pub fn known(info: NodeInfo) -> Self {
        NodeInfoSource {
            state: RwLock::new(Ok((info, None))),
        }
    }

    pub fn missing(hint: String) -> Self {
        NodeInfoSource {
            state: RwLock::new(Err(hint)),
        }
    }

    /// The identity is (still) unknown: NodeGetInfo answers FAILED_PRECONDITION with `hint`.
    pub fn set_missing(&self, hint: String) {
        *self.state.write().unwrap_or_else(|p| p.into_inner()) = Err(hint);
    }

    pub fn set(&self, info: NodeInfo) {
        *self.state.write().unwrap_or_else(|p| p.into_inner()) = Ok((info, None));
    }

    /// The identity is known; `live` recomputes max_volumes at each `get`.
    pub fn set_live(&self, info: NodeInfo, live: Arc<LiveLimit>) {
        *self.state.write().unwrap_or_else(|p| p.into_inner()) = Ok((info, Some(live)));
    }

    pub fn is_known(&self) -> bool {
        self.state.read().unwrap_or_else(|p| p.into_inner()).is_ok()
    }

    pub fn get(&self) -> Result<NodeInfo> {
        let (mut info, live) = self
            .state
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .map_err(|hint| Error::NodeIdentityUnknown { hint })?;
        if let Some(live) = live {
            info.max_volumes = live.current();
        }
        Ok(info)
    }
}

/// The host name, the loop backend's default node id.
pub fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}
