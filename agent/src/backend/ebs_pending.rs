//! PLACEHOLDER until the `ebs` branch's device discovery is merged: lets `serve --backend ebs`
//! start (identity, NodeGetInfo, Probe) while every device lookup answers UNAVAILABLE.

use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

use ebs_store::DeviceIdentity;

use super::{Backend, ResolvedDevice};
use crate::error::{Error, Result};
use crate::request::VolumeId;

const WHY: &str = "ebs device discovery is not built into this agent yet";

pub struct EbsPending;

impl Backend for EbsPending {
    fn resolve(
        &self,
        _volume: &VolumeId,
        _publish_context: &HashMap<String, String>,
        _volume_context: &HashMap<String, String>,
        _deadline: Instant,
    ) -> Result<ResolvedDevice> {
        Err(Error::Unavailable(WHY.into()))
    }

    fn still_is(
        &self,
        _device: &Path,
        _identity: &DeviceIdentity,
    ) -> std::result::Result<(), String> {
        Err(WHY.into())
    }

    fn refresh_size(&self, _device: &Path) -> Result<()> {
        Err(Error::Unavailable(WHY.into()))
    }
}
