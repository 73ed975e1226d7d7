//! The read-only open of `status` and `recover`: never a panic on a damaged file, never a hang
//! on what is no regular file, and the file's own locks held (an agent running on it is told).

use ebs_node_core::records::*;
use ebs_store::*;

mod common;
use common::*;

/// Found by the `state_file` fuzz target: a read-only open (`status`, `recover`'s lock probe)
/// of a file with one damaged page panicked inside redb (an abort in release builds). Every
/// page damaged in turn must give an answer, an error or the records, never a panic.
#[test]
fn a_damaged_page_is_an_error_for_read_only_opens_not_a_panic() {
    let dir = TempDir::new("damaged-page");
    let path = dir.0.join("state.redb");
    one_staged_volume(&path);
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

/// A read-only open reads a checked copy's bytes (`checked_read`), but its locks are the file's
/// own: while an agent holds the file, `status` and `recover` are told it is in use; while a
/// reader holds it, no agent opens it.
#[test]
fn a_read_only_open_holds_the_files_own_locks() {
    let dir = TempDir::new("read-only-locks");
    let path = dir.0.join("state.redb");
    let live = Store::open(&path).unwrap();
    live.write(Durability::Immediate, |w| w.put_staged(&staged("v1", 1)))
        .unwrap();
    match Store::open_read_only(&path) {
        Err(StoreError::Locked { .. }) => {}
        Err(e) => panic!("while an agent holds it: {e}"),
        Ok(_) => panic!("opened while an agent holds it"),
    }
    drop(live);
    let reader = Store::open_read_only(&path).unwrap();
    assert_eq!(reader.all_staged().unwrap().len(), 1);
    match Store::open(&path) {
        Err(StoreError::Locked { .. }) => {}
        Err(e) => panic!("while a reader holds it: {e}"),
        Ok(_) => panic!("an agent opened it while a reader holds it"),
    }
    drop(reader);
    Store::open(&path).expect("the reader gone");
}

/// What is at the state file's name when it is no regular file: `status` (a read-only open) and
/// the agent's own open answer at once that it is none, where a FIFO hung them, a link to
/// /dev/zero read for ever and one to /dev/urandom filled /tmp with its copy (a fifty-seventh
/// fresh review's F4).
#[test]
fn a_state_file_that_is_no_regular_file_is_refused_at_once() {
    let dir = TempDir::new("not-a-file");
    let fifo = dir.0.join("fifo.redb");
    assert!(
        std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let zero = dir.0.join("zero.redb");
    std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
    let random = dir.0.join("random.redb");
    std::os::unix::fs::symlink("/dev/urandom", &random).unwrap();
    for path in [&fifo, &zero, &random] {
        for open in [Store::open_read_only, Store::open] {
            match open(path) {
                Err(StoreError::Corrupt { detail, .. }) => {
                    assert!(detail.contains("not a regular file"), "{detail}")
                }
                Err(e) => panic!("{}: {e}", path.display()),
                Ok(_) => panic!("{} opened", path.display()),
            }
        }
    }
}
