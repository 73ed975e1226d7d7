//! Comparing device identities recorded in the journal with the ones found now.

use super::NodeCtx;
use super::backend::proves;
use crate::DevNum;
use crate::records::{DeviceIdentity, StagedVolume};

/// Whether two identities name the same volume. An unverified identity (Xen, no serial) cannot
/// contradict anything: the backend logged that it could not verify. Otherwise they must prove
/// each other (`backend::proves`: the same loop file inode, the same NVMe serial).
pub fn same_identity(recorded: &DeviceIdentity, now: &DeviceIdentity) -> bool {
    matches!(recorded, DeviceIdentity::Unverified)
        || matches!(now, DeviceIdentity::Unverified)
        || proves(recorded, now)
}

/// A device with no identity to prove is still the one staged while its numbers are the
/// recorded ones and the attachment there is the one it was staged on: a detach and a new
/// attach in between (a reboot, `losetup -d`, a forced detach) is another device, whatever it
/// shows. Asked at start-up and by every door that hands the staged device out again (a
/// forty-eighth fresh review's F2: a raw block publish gave a handle's pod another volume's
/// device attached at the same numbers since).
pub fn same_attachment(ctx: &NodeCtx, staged: &StagedVolume, devnum: DevNum) -> bool {
    let Some(recorded) = staged.attachment.as_deref() else {
        return false;
    };
    staged.devnum.map(DevNum::from) == Some(devnum)
        && ctx.host.attachment(devnum).as_deref() == Some(recorded)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loop_identity_is_the_inode_not_the_path() {
        let a = DeviceIdentity::LoopFile {
            file: "/a".into(),
            st_dev: 1,
            st_ino: 2,
        };
        let same_inode = DeviceIdentity::LoopFile {
            file: "/b".into(),
            st_dev: 1,
            st_ino: 2,
        };
        let swapped = DeviceIdentity::LoopFile {
            file: "/a".into(),
            st_dev: 1,
            st_ino: 3,
        };
        assert!(same_identity(&a, &same_inode));
        assert!(!same_identity(&a, &swapped));
        let s = DeviceIdentity::NvmeSerial {
            serial: "vol1".into(),
        };
        assert!(!same_identity(
            &s,
            &DeviceIdentity::NvmeSerial {
                serial: "vol2".into()
            }
        ));
        assert!(!same_identity(&s, &a));
    }
}
