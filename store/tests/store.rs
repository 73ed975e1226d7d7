use std::collections::BTreeMap;
use std::path::PathBuf;

use ebs_store::*;

mod common;
use common::*;

#[test]
fn records_survive_reopen() {
    let dir = TempDir::new("reopen");
    let path = dir.0.join("state.redb");
    {
        let store = Store::open(&path).unwrap();
        store
            .write(Durability::Immediate, |w| {
                w.put_staged(&staged("v1", 1))?;
                w.step("v1", "stage", "mount", Phase::Done, BTreeMap::new())?;
                Ok(())
            })
            .unwrap();
    }
    let store = Store::open(&path).unwrap();
    assert_eq!(store.staged("v1").unwrap(), Some(staged("v1", 1)));
    assert_eq!(store.journal("v1").unwrap().len(), 1);
    assert_eq!(store.known_volume_ids().unwrap(), vec!["v1".to_string()]);
}

#[test]
fn journal_is_bounded_and_ordered() {
    let dir = TempDir::new("bounded");
    let store = Store::open(&dir.0.join("s.redb")).unwrap();
    for i in 0..(JOURNAL_LINES_PER_VOLUME + 10) {
        store
            .write(Durability::Lazy, |w| {
                w.step(
                    "v",
                    "stage",
                    &format!("s{i}"),
                    Phase::Intent,
                    BTreeMap::new(),
                )
            })
            .unwrap();
    }
    let j = store.journal("v").unwrap();
    assert_eq!(j.len(), JOURNAL_LINES_PER_VOLUME);
    assert!(j.windows(2).all(|w| w[0].seq < w[1].seq));
    assert_eq!(
        j.last().unwrap().step,
        format!("s{}", JOURNAL_LINES_PER_VOLUME + 9)
    );
    // Several lines in one write are numbered and trimmed the same way.
    store
        .write(Durability::Lazy, |w| {
            for i in 0..10 {
                w.step("v", "stage", &format!("t{i}"), Phase::Done, BTreeMap::new())?;
            }
            Ok(())
        })
        .unwrap();
    let j = store.journal("v").unwrap();
    assert_eq!(j.len(), JOURNAL_LINES_PER_VOLUME);
    assert!(j.windows(2).all(|w| w[1].seq == w[0].seq + 1));
    assert_eq!(j.last().unwrap().step, "t9");
    // Trimming happens in batches, but readers always see the newest lines and no more.
    for i in 0..(3 * JOURNAL_LINES_PER_VOLUME) {
        store
            .write(Durability::Lazy, |w| {
                w.step("v", "stage", &format!("u{i}"), Phase::Done, BTreeMap::new())
            })
            .unwrap();
        let j = store.journal("v").unwrap();
        assert_eq!(j.len(), JOURNAL_LINES_PER_VOLUME);
        assert_eq!(j.last().unwrap().step, format!("u{i}"));
    }
}

#[test]
fn newer_schema_is_refused() {
    let dir = TempDir::new("newer");
    let path = dir.0.join("s.redb");
    {
        let db = redb::Database::create(&path).unwrap();
        let tx = db.begin_write().unwrap();
        {
            let mut t = tx
                .open_table(redb::TableDefinition::<&str, u64>::new("meta"))
                .unwrap();
            t.insert("schema_version", SCHEMA_VERSION + 1).unwrap();
        }
        tx.commit().unwrap();
    }
    let err = Store::open(&path).err().expect("must refuse");
    assert!(matches!(err, StoreError::NewerSchema { .. }), "{err}");
}

#[test]
fn garbage_file_is_refused_as_corrupt() {
    let dir = TempDir::new("garbage");
    let path = dir.0.join("s.redb");
    std::fs::write(&path, vec![0x5a; 8192]).unwrap();
    let err = Store::open(&path).err().expect("must refuse");
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
    assert!(err.to_string().contains("recover --from-mounts"));
}

#[test]
fn forget_volume_drops_everything() {
    let dir = TempDir::new("forget");
    let store = Store::open(&dir.0.join("s.redb")).unwrap();
    store
        .write(Durability::Immediate, |w| {
            w.put_staged(&staged("a", 1))?;
            w.put_staged(&staged("b", 1))?;
            w.step("a", "stage", "x", Phase::Done, BTreeMap::new())?;
            w.forget_volume("a")
        })
        .unwrap();
    assert!(store.staged("a").unwrap().is_none());
    assert!(store.journal("a").unwrap().is_empty());
    assert!(store.staged("b").unwrap().is_some());
}

/// Runs `f(thread_number)` on 8 threads at once and waits for all of them.
fn on_8_threads(f: impl Fn(usize) + Sync) {
    std::thread::scope(|s| {
        for t in 0..8 {
            let f = &f;
            s.spawn(move || f(t));
        }
    });
}

#[test]
fn concurrent_immediate_writes_share_syncs_and_all_land() {
    let dir = TempDir::new("group");
    let path = dir.0.join("state.redb");
    {
        let store = Store::open(&path).unwrap();
        on_8_threads(|t| {
            for i in 0..10 {
                let id = format!("v{t}-{i}");
                store
                    .write(Durability::Immediate, |w| w.put_staged(&staged(&id, 1)))
                    .unwrap();
                // Visible to this thread as soon as the write returns.
                assert!(store.staged(&id).unwrap().is_some());
            }
        });
    }
    let store = Store::open(&path).unwrap();
    assert_eq!(store.all_staged().unwrap().len(), 80);
}

#[test]
fn mixed_lazy_and_immediate_writers_see_their_writes_and_immediate_ones_last() {
    let dir = TempDir::new("mixed");
    let path = dir.0.join("state.redb");
    {
        let store = Store::open(&path).unwrap();
        on_8_threads(|t| {
            for i in 0..20 {
                let id = format!("v{t}-{i}");
                let durability = if i % 2 == 0 {
                    Durability::Immediate
                } else {
                    Durability::Lazy
                };
                store
                    .write(durability, |w| {
                        w.put_staged(&staged(&id, 1))?;
                        w.step(&id, "stage", "mount", Phase::Intent, BTreeMap::new())
                    })
                    .unwrap();
                assert!(store.staged(&id).unwrap().is_some());
                assert_eq!(store.journal(&id).unwrap().len(), 1);
            }
        });
        assert_eq!(store.all_staged().unwrap().len(), 160);
    }
    let store = Store::open(&path).unwrap();
    for t in 0..8 {
        for i in (0..20).step_by(2) {
            assert!(store.staged(&format!("v{t}-{i}")).unwrap().is_some());
        }
    }
}

#[test]
fn publications_of_one_volume_do_not_leak_into_a_prefix_sibling() {
    let dir = TempDir::new("pubs");
    let store = Store::open(&dir.0.join("s.redb")).unwrap();
    let publication = |vol: &str, target: &str| publication(vol, target, 1);
    store
        .write(Durability::Lazy, |w| {
            w.put_publication(&publication("v1", "/csi/a"))?;
            w.put_publication(&publication("v1", "/csi/b"))?;
            w.put_publication(&publication("v10", "/csi/c"))?;
            w.put_publication(&publication("v0", "/csi/d"))
        })
        .unwrap();
    let targets: Vec<_> = store
        .publications("v1")
        .unwrap()
        .into_iter()
        .map(|p| p.target_path)
        .collect();
    assert_eq!(
        targets,
        vec![PathBuf::from("/csi/a"), PathBuf::from("/csi/b")]
    );
    assert_eq!(store.publications("v10").unwrap().len(), 1);
    assert!(store.publications("v2").unwrap().is_empty());
}

/// Found by the `state_file` fuzz target: a read-only open (`status`, `recover`'s lock probe)
/// of a file with one damaged page panicked inside redb (an abort in release builds). Every
/// page damaged in turn must give an answer, an error or the records, never a panic.
#[test]
fn a_damaged_page_is_an_error_for_read_only_opens_not_a_panic() {
    let dir = TempDir::new("damaged-page");
    let path = dir.0.join("state.redb");
    {
        let store = Store::open(&path).unwrap();
        store
            .write(Durability::Immediate, |w| {
                w.put_staged(&staged("v1", 1))?;
                w.step("v1", "stage", "mount", Phase::Done, BTreeMap::new())?;
                Ok(())
            })
            .unwrap();
    }
    let good = std::fs::read(&path).unwrap();
    let damaged = dir.0.join("damaged.redb");
    let mut refused = 0;
    for page in (4096..good.len()).step_by(4096) {
        let mut bytes = good.clone();
        let end = (page + 16).min(bytes.len());
        bytes[page..end].fill(0xff);
        std::fs::write(&damaged, &bytes).unwrap();
        match Store::open_read_only(&damaged) {
            Ok(store) => {
                let _ = store.all_staged();
                let _ = store.journal("v1");
            }
            Err(StoreError::Corrupt { .. }) => refused += 1,
            Err(e) => panic!("page at {page}: {e}"),
        }
    }
    assert!(refused > 0, "no damage was noticed");
}

/// What redb leaves when a power cut stops it while it creates a file: the file at its first
/// size, the header without the magic number (redb writes that last, after the rest of the
/// header is durable), every other byte zero. Found by tests/tests/power_loss/ (a power cut
/// during the agent's first start); before the fix the agent refused to start on it.
fn cut_short_creation(path: &std::path::Path, header: bool) {
    let mut bytes = vec![0u8; 73728];
    if header {
        for (i, b) in bytes[9..320].iter_mut().enumerate() {
            *b = (i % 7) as u8;
        }
    }
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn a_creation_cut_short_is_set_aside_and_made_again() {
    for header in [true, false] {
        let dir = TempDir::new(&format!("cut-short-{header}"));
        let path = dir.0.join("s.redb");
        cut_short_creation(&path, header);
        let ro = Store::open_read_only(&path)
            .err()
            .expect("read-only open refuses");
        assert!(matches!(ro, StoreError::Unfinished(_)), "{ro}");
        assert!(ro.to_string().contains("holds no records"), "{ro}");
        let store = Store::open(&path).expect("the agent starts afresh");
        store
            .write(Durability::Immediate, |w| w.put_staged(&staged("v1", 1)))
            .unwrap();
        assert!(store.staged("v1").unwrap().is_some());
        let aside: Vec<_> = std::fs::read_dir(&dir.0)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().contains(".unfinished-"))
            .collect();
        assert_eq!(
            aside.len(),
            1,
            "the cut-short file is kept aside, not deleted"
        );
    }
}

#[test]
fn a_state_file_that_lost_its_magic_number_is_still_refused() {
    let dir = TempDir::new("lost-magic");
    let path = dir.0.join("s.redb");
    {
        let store = Store::open(&path).unwrap();
        store
            .write(Durability::Immediate, |w| w.put_staged(&staged("v1", 1)))
            .unwrap();
    }
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[..9].fill(0);
    std::fs::write(&path, bytes).unwrap();
    let err = Store::open(&path)
        .err()
        .expect("records were committed: refuse");
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
}

/// A lazy write is visible at once but on disk only after a durable commit: `sync` (what the
/// agent calls when it stops) makes it so. Reopened from the file's bytes as they were on disk,
/// a copy taken before the sync lacks the lazy record and one taken after has it.
#[test]
fn sync_makes_lazy_writes_durable() {
    let dir = TempDir::new("sync");
    let path = dir.0.join("s.redb");
    let store = Store::open(&path).unwrap();
    store
        .write(Durability::Lazy, |w| w.put_staged(&staged("lazy", 1)))
        .unwrap();
    assert!(store.staged("lazy").unwrap().is_some());
    let before = dir.0.join("before.redb");
    std::fs::copy(&path, &before).unwrap();
    store.sync().unwrap();
    let after = dir.0.join("after.redb");
    std::fs::copy(&path, &after).unwrap();
    let seen = |p: &std::path::Path| Store::open(p).unwrap().staged("lazy").unwrap().is_some();
    assert!(
        !seen(&before),
        "the lazy record was durable before the sync"
    );
    assert!(
        seen(&after),
        "the sync did not make the lazy record durable"
    );
}
