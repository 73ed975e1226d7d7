//! Comparing device identities recorded in the journal with the ones found now.

use super::backend::proves;
use crate::records::DeviceIdentity;

/// Whether two identities name the same volume. An unverified identity (Xen, no serial) cannot
/// contradict anything: the backend logged that it could not verify. Otherwise they must prove
/// each other (`backend::proves`: the same loop file inode, the same NVMe serial).
pub fn same_identity(recorded: &DeviceIdentity, now: &DeviceIdentity) -> bool {
    matches!(recorded, DeviceIdentity::Unverified)
        || matches!(now, DeviceIdentity::Unverified)
        || proves(recorded, now)
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
