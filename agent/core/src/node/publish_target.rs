//! A publish's target itself: a directory for a filesystem, a file for a raw block volume, made by
//! the publish, and used as it is only when an earlier attempt of the same publication made it.

use super::host::Entry;
use crate::error::{Error, Result};

/// An existing file at a block target is used only when an earlier attempt of this publication
/// (its durable intent) made it: anything else may be a host file (kubelet's config, the agent's
/// own state) that a bind would cover and a later unpublish would delete.
pub(super) fn check_ours_to_use(target: &dyn Entry, block: bool, recorded: bool) -> Result<()> {
    let st = target
        .stat()
        .map_err(|e| Error::io(format!("inspecting {}", target.path().display()), e))?;
    let Some(st) = st else { return Ok(()) };
    let unusable = |why| Error::UnusableTarget {
        path: target.path().to_path_buf(),
        why,
    };
    use crate::seam::FileKind as FileType;
    match (block, st.kind) {
        (false, FileType::Directory) => Ok(()),
        (true, FileType::RegularFile) if recorded => Ok(()),
        (true, FileType::RegularFile) => Err(unusable(
            "already exists and the agent did not create it; a block volume is published onto \
             a file the agent creates itself",
        )),
        (true, _) => Err(unusable(
            "exists and is not a regular file; a block volume is published onto a file",
        )),
        (false, _) => Err(unusable("exists and is not a directory")),
    }
}

pub(super) fn create(target: &dyn Entry, block: bool, recorded: bool) -> Result<()> {
    let made = if block {
        match target.create_file() {
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && recorded => Ok(()),
            other => other,
        }
    } else {
        target.mkdir()
    };
    made.map_err(|source| Error::TargetNotCreated {
        path: target.path().to_path_buf(),
        source,
    })
}
