#![no_main]
//! A damaged state file: the bytes become the redb file, which the agent opens (repairing it
//! if it must) and reads in full. Errors are fine; a panic or a hang is not.

use std::path::PathBuf;
use std::sync::OnceLock;

use ebs_store::Store;

fn scratch() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("ebs-fuzz-state-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a scratch directory");
        dir
    })
}

fn read_everything(store: &Store) {
    let _ = store.schema_version();
    let _ = store.loop_volumes();
    let _ = store.all_staged();
    let _ = store.all_publications();
    if let Ok(ids) = store.known_volume_ids() {
        for id in ids.iter().take(16) {
            let _ = store.format(id);
            let _ = store.staged(id);
            let _ = store.publications(id);
            let _ = store.journal(id);
        }
    }
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let path = scratch().join("state.redb");
    if std::fs::write(&path, data).is_err() {
        return;
    }
    if let Ok(store) = Store::open_read_only(&path) {
        read_everything(&store);
    }
    // The agent's own open: integrity check, repair, schema set-up.
    if let Ok(store) = Store::open(&path) {
        read_everything(&store);
    }
});
