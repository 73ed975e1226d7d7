//! What NodeGetInfo answers: found once at start (or later, in the background), never fetched on
//! the request path.

use std::collections::HashMap;
use std::sync::RwLock;

use crate::error::{Error, Result};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeInfo {
    pub node_id: String,
    pub max_volumes: i64,
    pub topology: HashMap<String, String>,
}

/// The node's identity, or the hint that tells an operator how to give it.
pub struct NodeInfoSource {
    state: RwLock<std::result::Result<NodeInfo, String>>,
}

impl NodeInfoSource {
    pub fn known(info: NodeInfo) -> Self {
        NodeInfoSource {
            state: RwLock::new(Ok(info)),
        }
    }

    pub fn missing(hint: String) -> Self {
        NodeInfoSource {
            state: RwLock::new(Err(hint)),
        }
    }

    pub fn set(&self, info: NodeInfo) {
        *self.state.write().unwrap_or_else(|p| p.into_inner()) = Ok(info);
    }

    pub fn get(&self) -> Result<NodeInfo> {
        self.state
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .map_err(Error::Precondition)
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
