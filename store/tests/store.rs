use std::collections::BTreeMap;
use std::path::PathBuf;

use ebs_node_core::records::*;
use ebs_store::*;

mod common;
use common::*;

#[test]
fn records_survive_reopen() {
    let dir = TempDir::new("reopen");
    let path = dir.0.join("state.redb");
    one_staged_volume(&path);
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

/// The files in `dir` whose name contains `part`.
fn named(dir: &std::path::Path, part: &str) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        // The boot log's two files sit beside the state file by design.
        .filter(|n| n.contains(part) && !n.contains(".boot-log-"))
        .collect()
}

/// The agent creates its state file under a temporary name (`<file>.creating`) and moves it
/// into place only once it is whole; a power cut during the first start leaves that temporary
/// file (in any of redb's creation stages), which the next start sets aside and makes again.
/// A file of an older agent, which created in place, is still recognised at the final name by
/// redb's own creation pattern: a header without its magic number, every other byte zero.
#[test]
fn a_creation_cut_short_is_set_aside_and_made_again() {
    let cases: [(&str, Option<bool>, &str); 4] = [
        ("creating-header", Some(true), "s.redb.creating"),
        ("creating-zeros", Some(false), "s.redb.creating"),
        ("creating-empty", None, "s.redb.creating"),
        ("older-agent", Some(true), "s.redb"),
    ];
    for (name, header, left) in cases {
        let dir = TempDir::new(&format!("cut-short-{name}"));
        let path = dir.0.join("s.redb");
        match header {
            Some(header) => cut_short_creation(&dir.0.join(left), header),
            None => std::fs::write(dir.0.join(left), b"").unwrap(),
        }
        if left == "s.redb" {
            let ro = Store::open_read_only(&path)
                .err()
                .expect("read-only open refuses");
            assert!(matches!(ro, StoreError::Unfinished(_)), "{name}: {ro}");
            assert!(ro.to_string().contains("holds no records"), "{ro}");
        }
        let store = Store::open(&path).expect("the agent starts afresh");
        store
            .write(Durability::Immediate, |w| w.put_staged(&staged("v1", 1)))
            .unwrap();
        assert!(store.staged("v1").unwrap().is_some());
        assert_eq!(
            named(&dir.0, ".unfinished-").len(),
            1,
            "{name}: the cut-short file is kept aside, not deleted"
        );
        assert!(named(&dir.0, ".creating").is_empty(), "{name}");
    }
}

/// A first start leaves exactly the state file, with its schema: no temporary name behind.
#[test]
fn a_new_state_file_appears_whole_under_its_name() {
    let dir = TempDir::new("appears-whole");
    let path = dir.0.join("s.redb");
    drop(Store::open(&path).unwrap());
    assert_eq!(named(&dir.0, "s.redb"), vec!["s.redb".to_string()]);
    let ro = Store::open_read_only(&path).unwrap();
    assert_eq!(ro.schema_version().unwrap(), Some(SCHEMA_VERSION));
}

/// An existing state file cut to 0 bytes, or whose every byte is zero (no header at all), is
/// corruption like any other: refused with the way out, and left as it is. Before the fix the
/// agent started on the empty file ready and with no volumes (redb takes an empty file for a
/// new database), and set an all-zero file aside as a "creation cut short".
#[test]
fn an_emptied_or_headerless_state_file_is_refused_with_the_way_out() {
    /// A name, and the bytes the file is left with given its length.
    type Damage = (&'static str, fn(usize) -> Vec<u8>);
    let cases: [Damage; 3] = [
        ("empty", |_| Vec::new()),
        ("zeroed", |len| vec![0u8; len]),
        ("short-zeroed", |_| vec![0u8; 100]),
    ];
    for (name, damage) in cases {
        let dir = TempDir::new(&format!("emptied-{name}"));
        let path = dir.0.join("s.redb");
        {
            let store = Store::open(&path).unwrap();
            store
                .write(Durability::Immediate, |w| w.put_staged(&staged("v1", 1)))
                .unwrap();
        }
        let len = std::fs::metadata(&path).unwrap().len() as usize;
        let bytes = damage(len);
        std::fs::write(&path, &bytes).unwrap();
        for (how, refused) in [
            ("open", Store::open(&path).err()),
            ("read-only open", Store::open_read_only(&path).err()),
        ] {
            let err = refused.unwrap_or_else(|| panic!("{name}: {how} accepted the file"));
            assert!(
                matches!(err, StoreError::Corrupt { .. }),
                "{name}: {how}: {err}"
            );
            let said = err.to_string();
            assert!(
                said.contains("recover --from-mounts") && said.contains("recover --reset"),
                "{name}: {how}: {said}"
            );
        }
        assert_eq!(std::fs::read(&path).unwrap(), bytes, "{name}: file changed");
        assert_eq!(
            named(&dir.0, "s.redb"),
            vec!["s.redb".to_string()],
            "{name}"
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
