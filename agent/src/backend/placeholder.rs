//! Stands in for the ebs backend on branches built without it: the agent starts (so the
//! Controller forwarding can be served and tested), and node calls say what is missing.

use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

use ebs_store::DeviceIdentity;

use super::{Backend, ResolvedDevice};
use crate::error::{Error, Result};
use crate::request::VolumeId;

const MISSING: &str = "ebs device discovery is not built in this branch";

pub struct NoDeviceDiscovery;

impl Backend for NoDeviceDiscovery {
    fn resolve(
        &self,
        _volume: &VolumeId,
        _publish_context: &HashMap<String, String>,
        _volume_context: &HashMap<String, String>,
        _deadline: Instant,
    ) -> Result<ResolvedDevice> {
        Err(Error::Unavailable(MISSING.into()))
    }

    fn still_is(
        &self,
        _device: &Path,
        _identity: &DeviceIdentity,
    ) -> std::result::Result<(), String> {
        Err(MISSING.into())
    }

    fn refresh_size(&self, _device: &Path) -> Result<()> {
        Err(Error::Unavailable(MISSING.into()))
    }
}
