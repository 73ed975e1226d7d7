//! Lazy writes return before redb holds them (the overlay): each writer still reads its own
//! writes at once, in order, with nothing counted twice, while others' batches land and the
//! flusher commits behind them; and a sync leaves exactly the same records on disk.

use std::collections::BTreeMap;

use ebs_node_core::records::*;
use ebs_store::*;

mod common;
use common::*;

/// What one volume's records should be.
#[derive(Default, Clone, Debug, PartialEq)]
struct Model {
    staged: Option<u64>,
    publications: BTreeMap<String, u64>,
    /// Every line's number `n`, in order.
    lines: Vec<u64>,
}

/// A small deterministic generator: the test replays the same interleaving choices per thread.
struct Rng(u64);
impl Rng {
    fn next(&mut self, below: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % below
    }
}

fn seen(store: &Store, id: &str) -> Model {
    Model {
        staged: store.staged(id).unwrap().map(|s| s.at_unix_ms),
        publications: store
            .publications(id)
            .unwrap()
            .into_iter()
            .map(|p| (p.target_path.display().to_string(), p.at_unix_ms))
            .collect(),
        lines: {
            let journal = store.journal(id).unwrap();
            let seqs: Vec<u64> = journal.iter().map(|l| l.seq).collect();
            assert!(
                seqs.windows(2).all(|w| w[1] == w[0] + 1),
                "{id}: line numbers not contiguous: {seqs:?}"
            );
            journal
                .iter()
                .map(|l| l.detail["n"].parse().unwrap())
                .collect()
        },
    }
}

/// The newest lines the journal keeps.
fn kept(mut m: Model) -> Model {
    let excess = m.lines.len().saturating_sub(JOURNAL_LINES_PER_VOLUME);
    m.lines.drain(..excess);
    m
}

#[test]
fn lazy_writers_read_their_own_writes_at_once_and_a_sync_keeps_exactly_them() {
    let dir = TempDir::new("overlay");
    let path = dir.0.join("state.redb");
    let models: Vec<BTreeMap<String, Model>> = {
        let store = Store::open(&path).unwrap();
        let models = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8u64)
                .map(|t| {
                    let store = &store;
                    s.spawn(move || {
                        let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (t + 1));
                        let mut models: BTreeMap<String, Model> = BTreeMap::new();
                        for n in 1..=400u64 {
                            let id = format!("v{t}-{}", rng.next(3));
                            let target = format!("/csi/t{}", rng.next(3));
                            let durability = if rng.next(4) == 0 {
                                Durability::Immediate
                            } else {
                                Durability::Lazy
                            };
                            let m = models.entry(id.clone()).or_default();
                            let kind = rng.next(5);
                            store
                                .write(durability, |w| {
                                    match kind {
                                        0 => w.put_staged(&staged(&id, n))?,
                                        1 => w.delete_staged(&id)?,
                                        2 => w.put_publication(&publication(&id, &target, n))?,
                                        3 => w.delete_publication(&id, target.as_ref())?,
                                        _ => {}
                                    }
                                    let detail = BTreeMap::from([("n".into(), n.to_string())]);
                                    w.step(&id, "stage", "mount", Phase::Done, detail)
                                })
                                .unwrap();
                            match kind {
                                0 => m.staged = Some(n),
                                1 => m.staged = None,
                                2 => {
                                    m.publications.insert(target.clone(), n);
                                }
                                3 => {
                                    m.publications.remove(&target);
                                }
                                _ => {}
                            }
                            m.lines.push(n);
                            assert_eq!(seen(store, &id), kept(m.clone()), "{id} after write {n}");
                            let one = store.publication(&id, target.as_ref()).unwrap();
                            assert_eq!(
                                one.map(|p| p.at_unix_ms),
                                m.publications.get(&target).copied()
                            );
                            assert!(store.knows_volume(&id).unwrap());
                            let recorded = store.recorded_volume_ids().unwrap().contains(&id);
                            assert_eq!(
                                recorded,
                                m.staged.is_some() || !m.publications.is_empty(),
                                "{id}"
                            );
                            let mine = |id: &String| id.starts_with(&format!("v{t}-"));
                            let all_staged: BTreeMap<String, u64> = store
                                .all_staged()
                                .unwrap()
                                .into_iter()
                                .filter(|s| mine(&s.volume_id))
                                .map(|s| (s.volume_id, s.at_unix_ms))
                                .collect();
                            let modelled: BTreeMap<String, u64> = models
                                .iter()
                                .filter_map(|(id, m)| m.staged.map(|n| (id.clone(), n)))
                                .collect();
                            assert_eq!(all_staged, modelled);
                        }
                        models
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap())
                .collect::<Vec<_>>()
        });
        store.sync().unwrap();
        models
    };
    // Reopened from the file: the synced records are exactly what the writers read back.
    let store = Store::open(&path).unwrap();
    let mut publications = 0;
    for thread in &models {
        for (id, m) in thread {
            assert_eq!(seen(&store, id), kept(m.clone()), "{id} after reopening");
            publications += m.publications.len();
        }
    }
    assert_eq!(store.all_publications().unwrap().len(), publications);
    assert_eq!(store.known_volume_ids().unwrap().len(), 24);
}

/// A lazy write followed by an immediate one that undoes it reads as undone the moment the
/// immediate one returns, whichever batch carried each.
#[test]
fn an_immediate_write_after_a_lazy_one_wins() {
    let dir = TempDir::new("overlay-order");
    let store = Store::open(&dir.0.join("s.redb")).unwrap();
    for round in 0..200u64 {
        let id = format!("v{}", round % 5);
        store
            .write(Durability::Lazy, |w| w.put_staged(&staged(&id, round)))
            .unwrap();
        store
            .write(Durability::Immediate, |w| w.delete_staged(&id))
            .unwrap();
        assert_eq!(store.staged(&id).unwrap(), None, "round {round}");
        assert!(!store.recorded_volume_ids().unwrap().contains(&id));
    }
}

/// Tickets continue across a reopen: a lazy write after it is not taken for one the file
/// already holds.
#[test]
fn lazy_writes_after_a_reopen_read_back() {
    let dir = TempDir::new("overlay-reopen");
    let path = dir.0.join("s.redb");
    for round in 0..3u64 {
        let store = Store::open(&path).unwrap();
        for i in 0..50u64 {
            let n = round * 100 + i;
            store
                .write(Durability::Lazy, |w| w.put_staged(&staged("v", n)))
                .unwrap();
            assert_eq!(store.staged("v").unwrap().map(|s| s.at_unix_ms), Some(n));
        }
        store.sync().unwrap();
    }
}

/// A lazy line is never shown ahead of an older line still on its way (a reviewer's attack:
/// shown as line n + 1, then as n + 2 once the older one landed before it).
#[test]
fn a_journal_line_keeps_its_number() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = TempDir::new("overlay-seq");
    let store = Store::open(&dir.0.join("s.redb")).unwrap();
    let stop = AtomicBool::new(false);
    let problems = std::sync::Mutex::new(Vec::<String>::new());
    std::thread::scope(|s| {
        let (store, stop, problems) = (&store, &stop, &problems);
        s.spawn(move || {
            for n in 0..300 {
                store
                    .write(Durability::Immediate, |w| line(w, "v", &format!("i{n}")))
                    .unwrap();
            }
            stop.store(true, Ordering::SeqCst);
        });
        s.spawn(move || {
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                store
                    .write(Durability::Lazy, |w| line(w, "v", &format!("l{n}")))
                    .unwrap();
                n += 1;
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
        });
        s.spawn(move || {
            let mut seen: BTreeMap<String, u64> = BTreeMap::new();
            while !stop.load(Ordering::SeqCst) {
                for l in store.journal("v").unwrap() {
                    let tag = l.detail["n"].clone();
                    if let Some(&before) = seen.get(&tag)
                        && before != l.seq
                    {
                        problems
                            .lock()
                            .unwrap()
                            .push(format!("{tag} read at {before}, later at {}", l.seq));
                    }
                    seen.insert(tag, l.seq);
                }
            }
        });
    });
    let p = problems.into_inner().unwrap();
    assert!(
        p.is_empty(),
        "{} renumbered, e.g. {:?}",
        p.len(),
        &p[..p.len().min(5)]
    );
}
