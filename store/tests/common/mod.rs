//! What the store's test files share: a scratch directory and records told apart by a number.
#![allow(dead_code)] // each test file uses its own part of it

use std::collections::BTreeMap;
use std::path::PathBuf;

use ebs_node_core::records::*;
use ebs_store::*;

/// A scratch directory, removed when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> Self {
        let p = std::env::temp_dir().join(format!("ebs-store-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A staged record whose `at_unix_ms` is `n`.
pub fn staged(id: &str, n: u64) -> StagedVolume {
    StagedVolume {
        volume_id: id.into(),
        staging_path: "/csi/s".into(),
        device: "/dev/loop3".into(),
        devnum: Some((7, 3)),
        identity: DeviceIdentity::Unverified,
        access: AccessRecord::Mount {
            fs_type: "ext4".into(),
            mount_flags: vec![],
        },
        access_mode: 1,
        readonly: false,
        progress: Progress::Complete,
        at_unix_ms: n,
        attachment: None,
    }
}

/// A publication record whose `at_unix_ms` is `n`.
pub fn publication(id: &str, target: &str, n: u64) -> Publication {
    Publication {
        volume_id: id.into(),
        target_path: target.into(),
        staging_path: "/csi/s".into(),
        block: false,
        readonly: false,
        access_mode: 1,
        mount_flags: vec![],
        progress: Progress::Complete,
        at_unix_ms: n,
    }
}

/// A done format record whose `at_unix_ms` is `n`.
pub fn format(id: &str, n: u64) -> FormatRecord {
    FormatRecord {
        volume_id: id.into(),
        fs_type: "ext4".into(),
        uuid: "u".into(),
        identity: DeviceIdentity::Unverified,
        state: FormatState::Done,
        at_unix_ms: n,
        attachment: None,
    }
}

/// A journal line of volume `id` whose detail `n` is `n`.
pub fn line(w: &mut Writer, id: &str, n: &str) -> Result<(), StoreError> {
    let detail = BTreeMap::from([("n".to_string(), n.to_string())]);
    w.step(id, "stage", "mount", Phase::Done, detail)
}

/// A state file at `path` holding one staged volume, `v1`, and one line of its journal, closed.
pub fn one_staged_volume(path: &std::path::Path) {
    let store = Store::open(path).unwrap();
    store
        .write(Durability::Immediate, |w| {
            w.put_staged(&staged("v1", 1))?;
            w.step("v1", "stage", "mount", Phase::Done, BTreeMap::new())?;
            Ok(())
        })
        .unwrap();
}

/// A child process's half of a kill test: when `var` names its scratch directory, the store in it
/// and the file where the child writes down each write once it returned.
pub fn child_store(var: &str) -> Option<(Store, std::fs::File)> {
    let dir = PathBuf::from(std::env::var(var).ok()?);
    let store = Store::open(&dir.join("s.redb")).unwrap();
    let log = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(dir.join("log"))
        .unwrap();
    Some((store, log))
}
