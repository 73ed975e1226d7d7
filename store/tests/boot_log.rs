//! The boot log (`Durability::Boot`): a write that returned outlives a kill of the process on
//! the same boot without an fsync, and a log of another boot or of another state file is never
//! replayed. The writer is a child process killed with SIGKILL at a point of the parent's
//! choosing; what it wrote down after each write returned is what must come back.

use std::collections::BTreeSet;
use std::path::Path;

use ebs_node_core::records::*;
use ebs_store::*;

mod common;
use common::*;

/// Child half of the tests below: Boot writes on one thread, lazy ones on two, none durable,
/// each written down once it returned, until killed.
#[test]
fn boot_child() {
    let Some((store, log)) = child_store("BOOT_CHILD") else {
        return;
    };
    use std::io::Write;
    std::thread::scope(|s| {
        for t in 0..3u64 {
            let (store, log) = (&store, &log);
            s.spawn(move || {
                let mut log = log;
                let (id, level) = if t == 0 {
                    ("boot".to_string(), Durability::Boot)
                } else {
                    (format!("lazy{t}"), Durability::Lazy)
                };
                let mut n = 0;
                loop {
                    store
                        .write(level, |w| {
                            w.put_publication(&publication(&id, &format!("/n{n}"), n))?;
                            line(w, &id, &n.to_string())
                        })
                        .unwrap();
                    log.write_all(format!("{id} {n}\n").as_bytes()).unwrap();
                    if n % 64 == 0 {
                        std::thread::sleep(std::time::Duration::from_millis(1));
                    }
                    n += 1;
                }
            });
        }
    });
}

/// Runs the child in `dir` for about `ms`, kills it, and returns what it wrote down as
/// returned: (id, n) pairs.
fn run_and_kill(dir: &Path, ms: u64) -> BTreeSet<(String, u64)> {
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "boot_child", "--test-threads=1", "--nocapture"])
        .env("BOOT_CHILD", dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(ms));
    child.kill().unwrap();
    child.wait().unwrap();
    std::fs::read_to_string(dir.join("log"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (id, n) = l.split_once(' ')?;
            Some((id.to_string(), n.parse().ok()?))
        })
        .collect()
}

fn present(store: &Store, id: &str, n: u64) -> bool {
    store
        .publication(id, format!("/n{n}").as_ref())
        .unwrap()
        .is_some()
}

#[test]
fn every_write_that_returned_outlives_a_kill_on_the_same_boot() {
    if std::env::var("BOOT_CHILD").is_ok() {
        return;
    }
    for round in 0..5u64 {
        let dir = TempDir::new(&format!("boot{round}"));
        let returned = run_and_kill(&dir.0, 250 + round * 151);
        let boot = returned.iter().filter(|(id, _)| id == "boot").count();
        assert!(boot > 10, "round {round}: only {boot} boot writes returned");
        let store = Store::open(&dir.0.join("s.redb")).unwrap();
        for (id, n) in &returned {
            assert!(
                present(&store, id, *n),
                "round {round}: {id} {n} returned, lost in the kill"
            );
        }
        for id in ["boot", "lazy1", "lazy2"] {
            let j = store.journal(id).unwrap();
            assert!(
                j.windows(2).all(|w| w[1].seq == w[0].seq + 1),
                "{id}: {j:?}"
            );
        }
        // Replayed durably, and the log emptied: a second start finds the same, once.
        drop(store);
        let store = Store::open(&dir.0.join("s.redb")).unwrap();
        for (id, n) in &returned {
            assert!(
                present(&store, id, *n),
                "round {round}: {id} {n} gone at the second start"
            );
        }
        eprintln!(
            "round {round}: {} writes returned, all back",
            returned.len()
        );
    }
}

/// The boot id in a log file's header (after its 8-byte magic), changed as a reboot would.
fn another_boot(path: &Path) {
    let mut bytes = std::fs::read(path).unwrap();
    if bytes.len() >= 44 {
        bytes[8..44].copy_from_slice(b"00000000-0000-0000-0000-000000000000");
        std::fs::write(path, bytes).unwrap();
    }
}

#[test]
fn a_log_of_another_boot_or_another_state_file_is_never_replayed() {
    if std::env::var("BOOT_CHILD").is_ok() {
        return;
    }
    let dir = TempDir::new("otherboot");
    let returned = run_and_kill(&dir.0, 400);
    assert!(returned.len() > 10);
    let state = dir.0.join("s.redb");
    for i in 0..2 {
        another_boot(&dir.0.join(format!("s.redb.boot-log-{i}")));
    }
    let store = Store::open(&state).unwrap();
    // Nothing was durable but what redb's own commits happened to leave: never a write past
    // the first one lost, so the records are a prefix of each writer's.
    for id in ["boot", "lazy1", "lazy2"] {
        let kept: Vec<u64> = (0..100_000)
            .take_while(|n| present(&store, id, *n))
            .collect();
        let lost = returned.iter().filter(|(i, _)| i == id).count() - kept.len();
        assert!(lost > 0, "{id}: a log of another boot was replayed");
    }
    drop(store);

    // Another state file at the same name (`recover --reset` set the old one aside): the
    // old file's log, of this boot, names the old file.
    let dir = TempDir::new("otherfile");
    let returned = run_and_kill(&dir.0, 400);
    assert!(returned.len() > 10);
    let state = dir.0.join("s.redb");
    std::fs::rename(&state, dir.0.join("s.redb.aside")).unwrap();
    let store = Store::open(&state).unwrap();
    for (id, n) in &returned {
        assert!(
            !present(&store, id, *n),
            "{id} {n}: replayed into another file"
        );
    }
}

/// An agent older than the boot log reads the state file without the writes only the log holds:
/// a file a killed run left says schema 2, which that agent refuses, and only a clean stop (every
/// write durable, the log emptied) sets it back to 1 (review 79's F1: a rollback
/// after a kill published a single-writer volume twice).
#[test]
fn a_killed_runs_file_is_refused_by_an_agent_without_the_log_until_a_clean_stop() {
    if std::env::var("BOOT_CHILD").is_ok() {
        return;
    }
    let dir = TempDir::new("rollback");
    run_and_kill(&dir.0, 300);
    let state = dir.0.join("s.redb");
    let schema = || {
        Store::open_read_only(&state)
            .unwrap()
            .schema_version()
            .unwrap()
    };
    assert_eq!(schema(), Some(2));
    let store = Store::open(&state).unwrap();
    store.close_cleanly().unwrap();
    drop(store);
    assert_eq!(schema(), Some(SCHEMA_AT_REST));
    for i in 0..2 {
        let len = std::fs::metadata(dir.0.join(format!("s.redb.boot-log-{i}")))
            .unwrap()
            .len();
        assert_eq!(len, 52, "boot-log-{i} is not emptied by a clean stop");
    }
}

/// A log file that is there but cannot be read may hold acknowledged writes: the start is
/// refused, never made without them (review 79's F2: a directory planted at one file lost its
/// writes, and the other file's were replayed by a later start onto a file that moved on).
#[test]
fn a_log_file_that_cannot_be_read_stops_the_start() {
    if std::env::var("BOOT_CHILD").is_ok() {
        return;
    }
    let dir = TempDir::new("unreadable");
    run_and_kill(&dir.0, 300);
    let state = dir.0.join("s.redb");
    let one = dir.0.join("s.redb.boot-log-1");
    std::fs::remove_file(&one).unwrap();
    std::fs::create_dir(&one).unwrap();
    let refused = Store::open(&state).err();
    assert!(
        matches!(refused, Some(StoreError::BootLog { .. })),
        "{refused:?}"
    );
    std::fs::remove_dir(&one).unwrap();
    Store::open(&state).unwrap();
}

/// A log a run left names that run: a later run (here one that found no log, as an agent older
/// than the log) moves the file on, and the old log, put back, is never replayed onto it
/// (review 79's F1, second part: fifteen stale writes deleted a live staging's record).
#[test]
fn a_log_left_by_an_earlier_run_is_never_replayed_into_a_later_one() {
    if std::env::var("BOOT_CHILD").is_ok() {
        return;
    }
    let dir = TempDir::new("stale");
    let returned = run_and_kill(&dir.0, 300);
    let state = dir.0.join("s.redb");
    let log = |i: u8| dir.0.join(format!("s.redb.boot-log-{i}"));
    let aside = |i: u8| dir.0.join(format!("aside-{i}"));
    for i in 0..2 {
        std::fs::rename(log(i), aside(i)).unwrap();
    }
    // The later run: whatever the old log held is gone from its view; it forgets every
    // publication it has and records one of its own, durably.
    let store = Store::open(&state).unwrap();
    store
        .write(Durability::Immediate, |w| {
            for (id, n) in &returned {
                w.delete_publication(id, format!("/n{n}").as_ref())?;
            }
            w.put_publication(&publication("later", "/later", 1))
        })
        .unwrap();
    drop(store);
    for i in 0..2 {
        std::fs::rename(aside(i), log(i)).unwrap();
    }
    let store = Store::open(&state).unwrap();
    assert!(
        store
            .publication("later", "/later".as_ref())
            .unwrap()
            .is_some()
    );
    for (id, n) in &returned {
        assert!(
            !present(&store, id, *n),
            "{id} {n}: a stale log was replayed"
        );
    }
}

/// A log file that is another name of the other log file, or of the state file, stops the start
/// and is left as it is: emptied in turn, one lost the other's writes, and the other truncated
/// the state file (an eighty-first fresh review's F1 and F2, root only).
#[test]
fn a_log_file_that_is_a_hard_link_stops_the_start() {
    if std::env::var("BOOT_CHILD").is_ok() {
        return;
    }
    let dir = TempDir::new("hardlink");
    run_and_kill(&dir.0, 300);
    let state = dir.0.join("s.redb");
    let (zero, one) = (
        dir.0.join("s.redb.boot-log-0"),
        dir.0.join("s.redb.boot-log-1"),
    );
    for target in [&zero, &state] {
        std::fs::remove_file(&one).unwrap();
        std::fs::hard_link(target, &one).unwrap();
        let refused = Store::open(&state).err();
        assert!(
            matches!(refused, Some(StoreError::BootLog { .. })),
            "{}: {refused:?}",
            target.display()
        );
        // Not emptied to a log's header (52 bytes): redb's own repair may change its length.
        assert!(std::fs::metadata(&state).unwrap().len() > 4096);
    }
    std::fs::remove_file(&one).unwrap();
    // Whole: it opens, and the child's last durable write is in it.
    let store = Store::open(&state).unwrap();
    assert_eq!(store.schema_version().unwrap(), Some(SCHEMA_VERSION));
}
