//! Whether the node still uses a loop volume's device: the loop controller never detaches one
//! that is staged or published (a detach, then an attach of another file, would reuse the
//! device's number under the node's mounts and records).

use std::path::Path;

use ebs_store::Store;

use ebs_node_core::error::{Error, Result};
use ebs_node_core::node::device_claim;
use ebs_node_host::device::{block_devnum, still_claimed};
use ebs_node_host::loopdev::overlay;

fn busy(id: &str, why: String) -> Result<()> {
    Err(Error::VolumeInUse {
        volume: id.to_string(),
        why,
    })
}

/// `Err(FAILED_PRECONDITION)` when the node's records stage or publish volume `id` (a stage
/// in progress included: its record is written before its mount).
pub fn refuse_if_recorded(store: &Store, id: &str) -> Result<()> {
    if let Some(staged) = store.staged(id)? {
        return busy(id, format!("staged at {}", staged.staging_path.display()));
    }
    if let Some(p) = store.publications(id)?.first() {
        return busy(id, format!("published at {}", p.target_path.display()));
    }
    Ok(())
}

/// `Err(FAILED_PRECONDITION)` when the node holds the volume's file under another id (a
/// node-local handle acting for it, on a loop device the controller did not make).
pub fn refuse_if_held_elsewhere(store: &Store, id: &str, file: &Path) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::metadata(file) else {
        return Ok(());
    };
    let identity = ebs_node_core::records::DeviceIdentity::LoopFile {
        file: file.to_path_buf(),
        st_dev: meta.dev(),
        st_ino: meta.ino(),
    };
    match device_claim::node_owner(store, &identity, None)? {
        Some(owner) if owner != id => {
            busy(id, format!("the node holds its file for volume {owner}"))
        }
        _ => Ok(()),
    }
}

/// `Err(FAILED_PRECONDITION)` while any loop device, at any offset and whoever made it, is
/// bound to the volume's file: deleting the file under it would leave the volume's bytes
/// reachable through the device.
pub fn refuse_if_any_loop_over(id: &str, file: &Path) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::metadata(file) else {
        return Ok(());
    };
    let Ok(entries) = std::fs::read_dir("/sys/block") else {
        return Ok(());
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with("loop") || !e.path().join("loop").exists() {
            continue;
        }
        let device = Path::new("/dev").join(&name);
        // A detach the kernel deferred until the device's last opener (udev's probe) lets go is
        // going away, not in use; an autoclear device that is mounted or claimed (`mount -o
        // loop`) is in use all the same.
        let autoclear = std::fs::read_to_string(e.path().join("loop/autoclear"));
        if autoclear.is_ok_and(|a| a.trim() == "1")
            && block_devnum(&device).is_ok_and(|d| !still_claimed(d))
        {
            continue;
        }
        let Some((st_dev, st_ino)) = ebs_node_host::loopdev::backing_inode(&device)
            .ok()
            .flatten()
        else {
            continue;
        };
        if (st_dev, st_ino) == (meta.dev(), meta.ino()) {
            return busy(
                id,
                format!("{} is still bound to its file", device.display()),
            );
        }
        // Laid through a filesystem that shows other files under names of its own, it may be
        // bound to this very file.
        let loop_dev = block_devnum(&device).unwrap_or(ebs_node_core::DevNum::new(0, 0));
        let pair = (st_dev, st_ino);
        if let Err(why) = super::stacked::believable(loop_dev, pair, Some(meta.dev())) {
            return busy(
                id,
                format!("{} may be bound to its file: {why}", device.display()),
            );
        }
    }
    Ok(())
}

/// `Err(FAILED_PRECONDITION)` naming the use, when the node still uses `device` for volume `id`.
pub fn refuse_if_in_use(store: &Store, id: &str, device: &Path) -> Result<()> {
    refuse_if_recorded(store, id)?;
    // The node may hold the device under another id (a node-local handle acting for the volume).
    if let Ok(Some((st_dev, st_ino))) = ebs_node_host::loopdev::backing_inode(device) {
        let identity = ebs_node_core::records::DeviceIdentity::LoopFile {
            file: std::path::PathBuf::new(),
            st_dev,
            st_ino,
        };
        // Its own claim (a format intent of an interrupted stage) does not keep it: a detach
        // ends the attachment that intent could license a redo on.
        if let Some(owner) = device_claim::node_owner(store, &identity, None)?
            && owner != id
        {
            return busy(id, format!("the node holds its device for volume {owner}"));
        }
    }
    let busy = |why: String| busy(id, why);
    let Ok(devnum) = block_devnum(device) else {
        return Ok(());
    };
    // A mounted filesystem (in any mount namespace) claims its device.
    if still_claimed(devnum) {
        return busy(format!("{} is mounted or claimed", device.display()));
    }
    // Every loop device laid over it, the agent's read-only ones or anyone's, keeps it; and a
    // device node bound onto a file claims nothing and opens nothing: a block publication the
    // records lost, or a workload's copy of one in a mount namespace of its own (a container's
    // runtime binds the device into the container). Only the mount tables show it, and a detach
    // would free the number under it for the next volume's loop device: every namespace's.
    let over = overlay::tagged("").map_err(|e| Error::LoopDevice {
        op: "listing loop devices".into(),
        source: Box::new(e),
    })?;
    let uses = ebs_node_host::device_binds::Uses::scan(ebs_node_host::device_binds::WITHIN);
    for o in over.iter().filter(|o| o.backing == devnum) {
        let used =
            block_devnum(&o.device).map_or_else(|e| Some(e.to_string()), |n| uses.of(&o.device, n));
        // An agent's read-only device that nothing uses and no record names (the volume has
        // none: `refuse_if_recorded`, under the volume's guard) is a stray a refused unpublish
        // kept and a rebuilt state lost: taken away as start-up recovery would.
        if used.is_none() && o.tag.starts_with(ebs_node_core::node::ro_tag::TAG_PREFIX) {
            ebs_node_host::loopdev::detach(&o.device).map_err(|e| Error::LoopDevice {
                op: format!("detaching {}", o.device.display()),
                source: Box::new(e),
            })?;
            tracing::info!(device = %o.device.display(), tag = %o.tag, volume = %id,
                "detached a read-only device nothing uses and no record names");
            continue;
        }
        return busy(format!(
            "read-only device {} lies over it{}",
            o.device.display(),
            used.map(|u| format!(" ({u})")).unwrap_or_default()
        ));
    }
    if let Some(at) = uses.bound(devnum) {
        return busy(format!("its device node is {at}"));
    }
    Ok(())
}
