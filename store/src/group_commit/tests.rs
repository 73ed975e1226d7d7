//! A failed batch keeps the held writes its callers were told were done (an eightieth fresh
//! review's F1: a held bind intent vanished when another caller's batch failed, and a second
//! publish of a single-writer volume was let through).

use std::sync::atomic::Ordering;

use ebs_node_core::records::{Durability, Progress, Publication};

use crate::Store;

/// A scratch directory, removed when dropped, even by a failed assertion.
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn new() -> Self {
        let p = std::env::temp_dir().join(format!("ebs-gc-failed-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn publication(id: &str) -> Publication {
    Publication {
        volume_id: id.into(),
        target_path: "/t".into(),
        staging_path: "/s".into(),
        block: false,
        readonly: false,
        access_mode: 1,
        mount_flags: vec![],
        progress: Progress::InProgress,
        at_unix_ms: 1,
    }
}

#[test]
fn a_failed_batch_keeps_the_held_writes_its_callers_were_told_were_done() {
    let scratch = Scratch::new();
    let dir = &scratch.0;
    let store = Store::open(&dir.join("s.redb")).unwrap();
    store.group.fail_batches.store(1, Ordering::Release);
    // Held at once (the caller binds and answers OK); the flusher's batch that takes it fails.
    store
        .write(Durability::Boot, |w| w.put_publication(&publication("a")))
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while store.group.fail_batches.load(Ordering::Acquire) > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no batch took the write"
        );
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    assert!(
        store.publication("a", "/t".as_ref()).unwrap().is_some(),
        "the held write vanished with the failed batch"
    );
    store
        .write(Durability::Immediate, |w| {
            w.put_publication(&publication("b"))
        })
        .unwrap();
    // Tried again in the next batch, and durable with it.
    store.sync().unwrap();
    assert!(store.publication("a", "/t".as_ref()).unwrap().is_some());
    drop(store);
    let store = Store::open(&dir.join("s.redb")).unwrap();
    assert!(store.publication("a", "/t".as_ref()).unwrap().is_some());
}
