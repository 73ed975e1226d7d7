//! What the state's bound forgets, and what it never does.

use std::collections::BTreeMap;
use std::path::PathBuf;

use ebs_node_core::records::*;
use ebs_store::*;

const LOOKING: [&str; 2] = ["resolve_device", "verify_identity"];

fn line(w: &mut Writer, id: &str, step: &str, phase: Phase) -> Result<(), StoreError> {
    w.step(id, "stage", step, phase, BTreeMap::new())
}

#[test]
fn only_volumes_that_nothing_but_looking_lines_name_are_forgotten() {
    let dir = std::env::temp_dir().join(format!("ebs-store-bounds-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let store = Store::open(&dir.join("state.redb")).unwrap();
    store
        .write(Durability::Immediate, |w| {
            for i in 0..50 {
                let id = format!("vol-unknown-{i}");
                line(w, &id, "resolve_device", Phase::Intent)?;
                line(w, &id, "resolve_device", Phase::Failed)?;
            }
            // A volume that got further: history, kept.
            line(w, "vol-history", "resolve_device", Phase::Done)?;
            line(w, "vol-history", "mount", Phase::Failed)?;
            // Looked for only, but a record names it: kept.
            line(w, "vol-formatted", "verify_identity", Phase::Failed)?;
            w.put_format(&FormatRecord {
                volume_id: "vol-formatted".into(),
                fs_type: "ext4".into(),
                uuid: "u".into(),
                identity: DeviceIdentity::Unverified,
                state: FormatState::Done,
                at_unix_ms: 1,
                attachment: None,
            })?;
            line(w, "lv-created", "resolve_device", Phase::Failed)?;
            w.put_loop_volume(&LoopVolume {
                id: "lv-created".into(),
                name: "n".into(),
                capacity_bytes: 1,
                file: PathBuf::from("/x.img"),
                parameters: BTreeMap::new(),
                attachment: None,
                created_unix_ms: 1,
                content_source: None,
            })?;
            Ok(())
        })
        .unwrap();
    let forget = store.journals_only_of(&LOOKING).unwrap();
    assert_eq!(forget.len(), 50, "{forget:?}");
    assert!(forget.iter().all(|id| id.starts_with("vol-unknown-")));
    for known in [
        "vol-history",
        "vol-formatted",
        "lv-created",
        "vol-unknown-7",
    ] {
        assert!(store.knows_volume(known).unwrap(), "{known}");
    }
    assert!(!store.knows_volume("vol-never").unwrap());
    assert!(
        !store.knows_volume("vol-unknown-").unwrap(),
        "a prefix names nothing"
    );
    drop(store);
    std::fs::remove_dir_all(&dir).unwrap();
}
