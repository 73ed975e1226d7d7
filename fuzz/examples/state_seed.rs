//! Writes the `state_file` target's seed: a small state file with one record of each kind, as
//! the agent leaves it. `cargo run --example state_seed -- fuzz/seeds/state_file/seed-0`
//! (run from the fuzz directory without the fuzzing RUSTFLAGS).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ebs_store::*;

fn main() -> Result<(), StoreError> {
    let out = PathBuf::from(std::env::args().nth(1).expect("output file"));
    let _ = std::fs::remove_file(&out);
    let store = Store::open(&out)?;
    let identity = DeviceIdentity::NvmeSerial {
        serial: "vol0123456789abcdef0".into(),
    };
    store.write(Durability::Immediate, |w| {
        w.put_loop_volume(&LoopVolume {
            id: "v1".into(),
            name: "pvc-1".into(),
            capacity_bytes: 64 << 20,
            file: "/var/lib/ebs/v1.img".into(),
            parameters: BTreeMap::new(),
            attachment: None,
            created_unix_ms: 1,
        })?;
        w.put_format(&FormatRecord {
            volume_id: "v1".into(),
            fs_type: "ext4".into(),
            uuid: "6e1f1d2c-0000-4000-8000-000000000000".into(),
            identity: identity.clone(),
            state: FormatState::Done,
            at_unix_ms: 2,
            attachment: None,
        })?;
        w.put_staged(&StagedVolume {
            volume_id: "v1".into(),
            staging_path: "/csi/s".into(),
            device: "/dev/nvme1n1".into(),
            identity,
            access: AccessRecord::Block,
            access_mode: 1,
            readonly: false,
            progress: Progress::Complete,
            at_unix_ms: 3,
            attachment: None,
        })?;
        w.put_publication(&Publication {
            volume_id: "v1".into(),
            target_path: "/csi/t".into(),
            staging_path: "/csi/s".into(),
            block: true,
            readonly: false,
            access_mode: 1,
            mount_flags: vec![],
            progress: Progress::Complete,
            at_unix_ms: 4,
        })?;
        w.step("v1", "stage", "format", Phase::Done, BTreeMap::new())?;
        Ok(())
    })?;
    drop(store);
    let len = std::fs::metadata(Path::new(&out))
        .map(|m| m.len())
        .unwrap_or(0);
    println!("{} bytes", len);
    Ok(())
}
