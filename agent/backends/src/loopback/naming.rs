//! The names the loop controller gives the devices it attaches (`ro_tag::AgentTag::attached_tag`,
//! a nineteenth and twentieth fresh review's F1): another agent on the host tells them from free
//! devices by these names, and this agent knows a device it made before its record (an attach a
//! crash cut) by its own name over the volume's whole file.

use super::LoopController;

impl LoopController {
    /// The name of the loop device attached for `volume`: this agent's tag for it, once known.
    pub(super) fn name_for(&self, volume: &str) -> Option<String> {
        self.agent_tag.get().map(|t| t.attached_tag(volume))
    }

    /// Whether `dev`, found over the volume's file, is the device this agent attached for
    /// `volume`: over the whole file (`inode`) with the access asked, and under this agent's own
    /// name for the volume. A name alone never makes a device the agent's.
    pub(super) fn named_ours(
        &self,
        volume: &str,
        dev: &std::path::Path,
        inode: (u64, u64),
        readonly: bool,
    ) -> bool {
        let Some(name) = self.name_for(volume) else {
            return false;
        };
        shown_name(dev).as_deref() == Some(name.as_str())
            && super::attach::whole_view(dev, inode, readonly)
    }

    /// Gives a device this agent attached for `volume` its name when it shows another (attached
    /// before agents named their devices, or renamed by whoever opened it: a twentieth fresh
    /// review's F1), so that a second agent on the host tells it from a free device.
    pub(super) fn keep_named(&self, volume: &str, device: &std::path::Path) {
        let Some(name) = self.name_for(volume) else {
            return;
        };
        if shown_name(device).as_deref() == Some(name.as_str()) {
            return;
        }
        match ebs_node_host::loopdev::rename(device, &name) {
            Ok(()) => tracing::info!(volume, device = %device.display(), name = %name,
                "named the volume's loop device as this agent's"),
            Err(e) => tracing::warn!(volume, device = %device.display(), error = %e,
                "could not name the volume's loop device as this agent's"),
        }
    }
}

/// The name a bound loop device shows (its `lo_file_name`); `None` when it cannot be read.
fn shown_name(dev: &std::path::Path) -> Option<String> {
    let f = std::fs::File::open(dev).ok()?;
    let status = ebs_node_host::loopdev::overlay::status_of(&f, dev).ok()??;
    Some(status.tag)
}
