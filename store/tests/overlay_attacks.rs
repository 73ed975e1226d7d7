//! Attacks on the lazy-write overlay (`store/src/overlay.rs`) by a reviewer who had not seen
//! it: readers on other threads, writes ordered through a channel, drop and reopen cycles, shared
//! keys, and a SIGKILL after acknowledged writes. The journal-number attack is in `overlay.rs`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use ebs_node_core::records::*;
use ebs_store::*;

mod common;
use common::*;

/// Once a reader saw a journal line at some number, it must keep that number (until trimmed).
/// Two writers on ONE volume: an immediate one and a lazy one.
#[test]
fn readers_on_other_threads_see_exactly_a_window_of_returned_writes() {
    const WRITERS: usize = 6;
    let dir = TempDir::new("lin");
    let path = dir.0.join("s.redb");
    let store = Store::open(&path).unwrap();
    // Per writer: the last version returned, and the last version started.
    let returned: Vec<AtomicU64> = (0..WRITERS).map(|_| AtomicU64::new(0)).collect();
    let started: Vec<AtomicU64> = (0..WRITERS).map(|_| AtomicU64::new(0)).collect();
    let done = AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..WRITERS {
            let (store, returned, started, done) = (&store, &returned, &started, &done);
            s.spawn(move || {
                let id = format!("w{t}");
                let mut x: u64 = 0x9e37_79b9 ^ ((t as u64 + 1) * 7919);
                for n in 1..=600u64 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let d = if x.is_multiple_of(4) {
                        Durability::Immediate
                    } else {
                        Durability::Lazy
                    };
                    started[t].store(n, Ordering::SeqCst);
                    store
                        .write(d, |w| {
                            w.put_format(&format(&id, n))?;
                            if n % 3 == 0 {
                                w.delete_staged(&id)?;
                                w.delete_publication(&id, "/p".as_ref())?;
                            } else {
                                w.put_staged(&staged(&id, n))?;
                                w.put_publication(&publication(&id, "/p", n))?;
                            }
                            line(w, &id, &n.to_string())
                        })
                        .unwrap();
                    returned[t].store(n, Ordering::SeqCst);
                }
                done.fetch_add(1, Ordering::SeqCst);
            });
        }
        for r in 0..2 {
            let (store, returned, started, done) = (&store, &returned, &started, &done);
            s.spawn(move || {
                let mut reads = 0u64;
                while done.load(Ordering::SeqCst) < WRITERS as u64 {
                    let t = (reads as usize + r) % WRITERS;
                    let id = format!("w{t}");
                    let lo = returned[t].load(Ordering::SeqCst);
                    let ok_range = |v: u64, hi: u64| v >= lo && v <= hi;
                    let f = store.format(&id).unwrap().map(|f| f.at_unix_ms);
                    let st = store.staged(&id).unwrap().map(|s| s.at_unix_ms);
                    let p = store
                        .publication(&id, "/p".as_ref())
                        .unwrap()
                        .map(|p| p.at_unix_ms);
                    let j = store.journal(&id).unwrap();
                    let all_st: Option<u64> = store
                        .all_staged()
                        .unwrap()
                        .into_iter()
                        .find(|s| s.volume_id == id)
                        .map(|s| s.at_unix_ms);
                    let all_p: Option<u64> = store
                        .all_publications()
                        .unwrap()
                        .into_iter()
                        .find(|s| s.volume_id == id)
                        .map(|s| s.at_unix_ms);
                    let recorded = store.recorded_volume_ids().unwrap().contains(&id);
                    let hi = started[t].load(Ordering::SeqCst);
                    if lo > 0 {
                        let fv = f.expect("format");
                        assert!(ok_range(fv, hi), "format {fv} not in [{lo},{hi}]");
                        for v in [st, all_st, p, all_p] {
                            match v {
                                Some(v) => {
                                    assert!(ok_range(v, hi) && v % 3 != 0, "{v} [{lo},{hi}]")
                                }
                                None => assert!(
                                    (lo..=hi).any(|n| n % 3 == 0),
                                    "deleted, but no delete in [{lo},{hi}]"
                                ),
                            }
                        }
                        if !recorded {
                            assert!((lo..=hi).any(|n| n % 3 == 0), "unrecorded in [{lo},{hi}]");
                        }
                        let seqs: Vec<u64> = j.iter().map(|l| l.seq).collect();
                        assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{seqs:?}");
                        let ns: Vec<u64> =
                            j.iter().map(|l| l.detail["n"].parse().unwrap()).collect();
                        assert!(ns.windows(2).all(|w| w[1] == w[0] + 1), "{ns:?}");
                        let last = *ns.last().unwrap();
                        assert!(ok_range(last, hi), "journal last {last} not in [{lo},{hi}]");
                        assert_eq!(
                            j.last().unwrap().seq,
                            last,
                            "seq equals n (one line per write)"
                        );
                    }
                    reads += 1;
                }
            });
        }
    });
    // After a sync and a reopen: exactly the last write of each writer.
    store.sync().unwrap();
    drop(store);
    let store = Store::open(&path).unwrap();
    for t in 0..WRITERS {
        let id = format!("w{t}");
        assert_eq!(store.format(&id).unwrap().unwrap().at_unix_ms, 600);
        assert_eq!(store.staged(&id).unwrap(), None);
        assert_eq!(store.journal(&id).unwrap().last().unwrap().seq, 600);
    }
}

/// Two writers on one volume hand a token back and forth (a happens-before edge through a
/// channel): each write must win over the other's previous one, and the reader of the token
/// sees it at once.
#[test]
fn writes_ordered_through_a_channel_win_in_that_order() {
    let dir = TempDir::new("pingpong");
    let store = Store::open(&dir.0.join("s.redb")).unwrap();
    let (to_b, from_a) = std::sync::mpsc::channel::<u64>();
    let (to_a, from_b) = std::sync::mpsc::channel::<u64>();
    std::thread::scope(|s| {
        let store = &store;
        s.spawn(move || {
            let mut n = 0;
            while n < 2000 {
                let d = if n % 7 == 0 {
                    Durability::Immediate
                } else {
                    Durability::Lazy
                };
                store
                    .write(d, |w| {
                        w.put_staged(&staged("v", n))?;
                        line(w, "v", &n.to_string())
                    })
                    .unwrap();
                to_b.send(n).unwrap();
                n = from_b.recv().unwrap() + 1;
                assert_eq!(store.staged("v").unwrap().unwrap().at_unix_ms, n - 1);
                assert_eq!(
                    store.journal("v").unwrap().last().unwrap().detail["n"],
                    (n - 1).to_string()
                );
            }
            drop(to_b);
        });
        s.spawn(move || {
            while let Ok(n) = from_a.recv() {
                assert_eq!(store.staged("v").unwrap().unwrap().at_unix_ms, n);
                assert_eq!(store.all_staged().unwrap()[0].at_unix_ms, n);
                let d = if n % 5 == 0 {
                    Durability::Immediate
                } else {
                    Durability::Lazy
                };
                store
                    .write(d, |w| {
                        w.put_staged(&staged("v", n + 1))?;
                        line(w, "v", &(n + 1).to_string())
                    })
                    .unwrap();
                let _ = to_a.send(n + 1);
            }
        });
    });
    let j = store.journal("v").unwrap();
    assert!(j.windows(2).all(|w| w[1].seq == w[0].seq + 1));
}

/// Open, write lazily (held by the overlay), drop at once, many times: every drop must commit
/// what is held, and reopen must not take a new write for one the file holds.
#[test]
fn drop_reopen_cycles_keep_every_held_write() {
    let dir = TempDir::new("cycles");
    let path = dir.0.join("s.redb");
    let mut expect_lines = 0u64;
    for round in 0..60u64 {
        let store = Store::open(&path).unwrap();
        assert_eq!(
            store.staged("v").unwrap().map(|s| s.at_unix_ms),
            round.checked_sub(1).map(|r| r * 10 + 9),
            "round {round}"
        );
        assert_eq!(
            store
                .journal("v")
                .unwrap()
                .last()
                .map(|l| l.seq)
                .unwrap_or(0),
            expect_lines
        );
        std::thread::scope(|s| {
            for t in 0..2 {
                let store = &store;
                s.spawn(move || {
                    for i in 0..5 {
                        store
                            .write(Durability::Lazy, |w| line(w, "v", &format!("{t}-{i}")))
                            .unwrap();
                    }
                });
            }
        });
        for i in 0..10 {
            store
                .write(Durability::Lazy, |w| {
                    w.put_staged(&staged("v", round * 10 + i))
                })
                .unwrap();
        }
        expect_lines += 10;
        if round % 3 == 0 {
            store
                .write(Durability::Lazy, |w| w.forget_volume("gone"))
                .unwrap();
        }
    }
}

/// Many threads, the same keys: the final value after sync must be the one the last-returning
/// write (in a total order we impose with a mutex around write+record) put.
#[test]
fn serialized_writers_on_shared_keys_end_with_the_last() {
    let dir = TempDir::new("shared");
    let path = dir.0.join("s.redb");
    let store = Store::open(&path).unwrap();
    let order = std::sync::Mutex::new(BTreeMap::<String, Option<u64>>::new());
    let counter = AtomicU64::new(1);
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let (store, order, counter) = (&store, &order, &counter);
            s.spawn(move || {
                for i in 0..300u64 {
                    let id = format!("k{}", (i + t) % 3);
                    let d = if (i + t) % 6 == 0 {
                        Durability::Immediate
                    } else {
                        Durability::Lazy
                    };
                    // Serialize write+model update so the model order equals the return order.
                    let mut m = order.lock().unwrap();
                    let n = counter.fetch_add(1, Ordering::SeqCst);
                    let del = n % 4 == 0;
                    store
                        .write(d, |w| {
                            if del {
                                w.delete_publication(&id, "/x".as_ref())
                            } else {
                                w.put_publication(&publication(&id, "/x", n))
                            }
                        })
                        .unwrap();
                    m.insert(id.clone(), if del { None } else { Some(n) });
                    drop(m);
                    // Others may write meanwhile; at least check the read is not older than ours.
                }
            });
        }
    });
    let m = order.into_inner().unwrap();
    for (id, v) in &m {
        assert_eq!(
            store
                .publication(id, "/x".as_ref())
                .unwrap()
                .map(|p| p.at_unix_ms),
            *v
        );
    }
    store.sync().unwrap();
    drop(store);
    let store = Store::open(&path).unwrap();
    for (id, v) in &m {
        assert_eq!(
            store
                .publication(id, "/x".as_ref())
                .unwrap()
                .map(|p| p.at_unix_ms),
            *v
        );
    }
}

/// Child half of `an_immediate_write_carries_every_lazy_write_returned_before_it_across_a_kill`.
#[test]
fn crash_child() {
    let Some((store, log)) = child_store("ADV_CHILD") else {
        return;
    };
    use std::io::Write;
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let (store, log) = (&store, &log);
            s.spawn(move || {
                let mut log = log;
                // Writes until the parent kills this process: no bound on purpose, so a counter
                // and `loop` (an unbounded `for n in 0..` is a lint on newer toolchains).
                let mut n = 0;
                loop {
                    if t == 3 {
                        log.write_all(format!("S {n}\n").as_bytes()).unwrap();
                        store
                            .write(Durability::Immediate, |w| {
                                w.put_publication(&publication("imm", &format!("/n{n}"), n))
                            })
                            .unwrap();
                        log.write_all(format!("D {n}\n").as_bytes()).unwrap();
                    } else {
                        let id = format!("v{t}");
                        store
                            .write(Durability::Lazy, |w| {
                                w.put_publication(&publication(&id, &format!("/n{n}"), n))?;
                                line(w, &id, &n.to_string())
                            })
                            .unwrap();
                        log.write_all(format!("L {t} {n}\n").as_bytes()).unwrap();
                        if n % 50 == 0 {
                            std::thread::sleep(std::time::Duration::from_millis(1));
                        }
                    }
                    n += 1;
                }
            });
        }
    });
}

#[test]
fn an_immediate_write_carries_every_lazy_write_returned_before_it_across_a_kill() {
    if std::env::var("ADV_CHILD").is_ok() {
        return;
    }
    let exe = std::env::current_exe().unwrap();
    for round in 0..6u64 {
        let dir = TempDir::new(&format!("kill{round}"));
        let mut child = std::process::Command::new(&exe)
            .args(["--exact", "crash_child", "--test-threads=1", "--nocapture"])
            .env("ADV_CHILD", &dir.0)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(300 + round * 137));
        child.kill().unwrap();
        child.wait().unwrap();
        let log = std::fs::read_to_string(dir.0.join("log")).unwrap();
        let lines: Vec<&str> = log.lines().collect();
        let done: std::collections::BTreeSet<&str> =
            lines.iter().filter_map(|l| l.strip_prefix("D ")).collect();
        // Position of the last "S n" whose write returned.
        let last_start = lines
            .iter()
            .rposition(|l| l.strip_prefix("S ").is_some_and(|n| done.contains(n)))
            .unwrap_or(0);
        let store = Store::open(&dir.0.join("s.redb")).unwrap();
        for n in &done {
            assert!(
                store
                    .publication("imm", format!("/n{n}").as_ref())
                    .unwrap()
                    .is_some(),
                "round {round}: immediate {n} returned but is lost"
            );
        }
        let mut checked = 0;
        for l in &lines[..last_start] {
            if let Some(rest) = l.strip_prefix("L ") {
                let (t, n) = rest.split_once(' ').unwrap();
                assert!(
                    store
                        .publication(&format!("v{t}"), format!("/n{n}").as_ref())
                        .unwrap()
                        .is_some(),
                    "round {round}: lazy {t}/{n} returned before an immediate write started, lost"
                );
                checked += 1;
            }
        }
        for t in 0..3 {
            let j = store.journal(&format!("v{t}")).unwrap();
            assert!(j.windows(2).all(|w| w[1].seq == w[0].seq + 1));
        }
        eprintln!(
            "round {round}: {} immediate, {checked} lazy checked",
            done.len()
        );
    }
}
