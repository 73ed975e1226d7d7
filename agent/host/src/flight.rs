//! One look at the host shared by the callers that ask for it at once. A caller gets the result
//! of the first look that started after it asked, so what it is told is at least as new as its
//! question (a stage that has just mounted sees its mount), as if it had looked itself; but
//! sixteen stages asking together cost two looks, not sixteen. Used for the walks whose cost
//! grows with the host (every process's namespaces, every loop device): at 128 loop volumes and
//! concurrency 16 they were most of the agent's CPU in the bench.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// A kind of look, one at a time.
pub struct Flight<T> {
    state: Mutex<State<T>>,
    landed: Condvar,
}

struct State<T> {
    /// How many looks were started.
    started: u64,
    /// The newest look started, while it runs: its number, and when it is overdue
    /// (`Lead::Detached`'s time after it started).
    running: Option<(u64, Option<Instant>)>,
    /// The newest look that ended: its number and what it saw.
    last: Option<(u64, Arc<T>)>,
    /// Looks started and not ended, overdue ones included.
    live: usize,
}

/// How many looks may run at once, overdue ones included. A look that hangs for good (a stat
/// below a FUSE mount that never answers) once left its thread and files behind at every call
/// while the hang lasted (a forty-fifth fresh review's F8: two threads and eight files a stage);
/// past this many, callers wait for one to end, up to their own time, as for any look.
const MOST_LIVE: usize = 3;

/// How the leading caller looks.
pub enum Lead {
    /// In its own thread (a walk that cannot hang).
    Inline,
    /// In a thread of its own, that nobody waits for past the time given (a stat below a dead
    /// NFS mount hangs): a caller then gets `None`. A look running longer than that no longer
    /// holds the next caller back: it starts a look of its own beside it.
    Detached(Duration),
}

impl<T: Send + Sync + 'static> Flight<T> {
    pub const fn new() -> Flight<T> {
        Flight {
            state: Mutex::new(State {
                started: 0,
                running: None,
                last: None,
                live: 0,
            }),
            landed: Condvar::new(),
        }
    }

    /// What a look started after this call saw; `failed` stands for a look that panicked or
    /// could not start. `None`: none ended within `Lead::Detached`'s time.
    pub fn look(&'static self, lead: Lead, work: fn() -> T, failed: fn() -> T) -> Option<Arc<T>> {
        let deadline = match lead {
            Lead::Inline => None,
            Lead::Detached(within) => Some(Instant::now() + within),
        };
        let mut state = self.lock();
        let wanted = state.started + 1;
        loop {
            if let Some((number, seen)) = &state.last
                && *number >= wanted
            {
                return Some(Arc::clone(seen));
            }
            if deadline.is_some_and(|at| Instant::now() >= at) {
                return None;
            }
            let held_back = state.live >= MOST_LIVE
                || state
                    .running
                    .is_some_and(|(_, due)| due.is_none_or(|due| Instant::now() < due));
            if !held_back {
                state.started += 1;
                state.live += 1;
                let due = match lead {
                    Lead::Inline => None,
                    Lead::Detached(within) => Some(Instant::now() + within),
                };
                state.running = Some((state.started, due));
                let landing = Landing {
                    flight: self,
                    number: state.started,
                    seen: None,
                    failed,
                };
                drop(state);
                match deadline {
                    None => landing.run(work),
                    Some(_) => {
                        let spawned = std::thread::Builder::new()
                            .name("host-look".into())
                            .spawn(move || landing.run(work));
                        // A thread that could not start lands as failed (its closure, and
                        // the landing in it, is dropped).
                        drop(spawned);
                    }
                }
                state = self.lock();
                continue;
            }
            // Woken by a landing, at the caller's deadline, or when the running look is
            // overdue (then this caller starts one beside it).
            let due = state.running.and_then(|(_, due)| due);
            state = match deadline {
                None => self
                    .landed
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner),
                Some(at) => {
                    let left = at.saturating_duration_since(Instant::now());
                    let until = due.map_or(left, |due| {
                        left.min(due.saturating_duration_since(Instant::now()))
                    });
                    self.landed
                        .wait_timeout(state, until)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
            };
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T: Send + Sync + 'static> Default for Flight<T> {
    fn default() -> Self {
        Flight::new()
    }
}

/// Ends a look, also when it panicked or its thread never ran (then as `failed`).
struct Landing<T: Send + Sync + 'static> {
    flight: &'static Flight<T>,
    number: u64,
    seen: Option<T>,
    failed: fn() -> T,
}

impl<T: Send + Sync + 'static> Landing<T> {
    fn run(mut self, work: fn() -> T) {
        self.seen = Some(work());
    }
}

impl<T: Send + Sync + 'static> Drop for Landing<T> {
    fn drop(&mut self) {
        let seen = self.seen.take().unwrap_or_else(self.failed);
        let mut state = self.flight.lock();
        state.live = state.live.saturating_sub(1);
        if state
            .running
            .is_some_and(|(number, _)| number == self.number)
        {
            state.running = None;
        }
        // An overdue look that ends after a newer one tells nothing new.
        if state
            .last
            .as_ref()
            .is_none_or(|(last, _)| *last < self.number)
        {
            state.last = Some((self.number, Arc::new(seen)));
        }
        self.flight.landed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    static LOOKS: AtomicU64 = AtomicU64::new(0);
    static SHARED: Flight<u64> = Flight::new();

    fn slow_look() -> u64 {
        std::thread::sleep(Duration::from_millis(20));
        LOOKS.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Callers at once share looks, and each gets one that started after it asked.
    #[test]
    fn callers_at_once_share_a_look_that_started_after_they_asked() {
        let before = LOOKS.load(Ordering::SeqCst);
        let seen: Vec<(u64, u64)> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..16)
                .map(|_| {
                    s.spawn(|| {
                        let asked = LOOKS.load(Ordering::SeqCst);
                        let got = *SHARED.look(Lead::Inline, slow_look, || 0).unwrap();
                        (asked, got)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let looks = LOOKS.load(Ordering::SeqCst) - before;
        assert!(looks <= 4, "16 callers at once took {looks} looks");
        for (asked, got) in seen {
            assert!(
                got > asked,
                "a look that ended before the question was given"
            );
        }
    }

    static HUNG: Flight<u64> = Flight::new();
    static HUNG_RUNNING: AtomicU64 = AtomicU64::new(0);
    static HUNG_MOST: AtomicU64 = AtomicU64::new(0);

    fn hung_look() -> u64 {
        let now = HUNG_RUNNING.fetch_add(1, Ordering::SeqCst) + 1;
        HUNG_MOST.fetch_max(now, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(300));
        HUNG_RUNNING.fetch_sub(1, Ordering::SeqCst);
        7
    }

    /// A look that takes too long leaves its callers with nothing, and holds no later caller
    /// back: that one starts a look of its own beside it.
    #[test]
    fn a_detached_look_past_its_time_gives_nothing_and_holds_nobody_back() {
        let lead = || Lead::Detached(Duration::from_millis(30));
        assert!(HUNG.look(lead(), hung_look, || 0).is_none());
        let later = HUNG.look(Lead::Detached(Duration::from_secs(5)), hung_look, || 0);
        assert_eq!(later.as_deref(), Some(&7));
        assert_eq!(
            HUNG_MOST.load(Ordering::SeqCst),
            2,
            "the later caller waited for the overdue look to end"
        );
    }

    static STUCK: Flight<u64> = Flight::new();
    static STUCK_RUNNING: AtomicU64 = AtomicU64::new(0);
    static STUCK_MOST: AtomicU64 = AtomicU64::new(0);

    fn stuck_look() -> u64 {
        let now = STUCK_RUNNING.fetch_add(1, Ordering::SeqCst) + 1;
        STUCK_MOST.fetch_max(now, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(400));
        STUCK_RUNNING.fetch_sub(1, Ordering::SeqCst);
        7
    }

    /// Looks that hang do not pile up: past `MOST_LIVE` at once, callers wait instead of
    /// starting another (each would leave a thread behind for as long as the hang lasts).
    #[test]
    fn hung_looks_do_not_pile_up() {
        for _ in 0..8 {
            let _ = STUCK.look(Lead::Detached(Duration::from_millis(20)), stuck_look, || 0);
        }
        let most = STUCK_MOST.load(Ordering::SeqCst);
        assert!(most <= MOST_LIVE as u64, "{most} hung looks ran at once");
    }

    static PANICKY: Flight<u64> = Flight::new();

    fn panicking_look() -> u64 {
        panic!("a look that panics")
    }

    /// A look that panics lands as failed: its callers are not left waiting.
    #[test]
    fn a_panicking_detached_look_lands_as_failed() {
        let got = PANICKY.look(
            Lead::Detached(Duration::from_secs(5)),
            panicking_look,
            || 42,
        );
        assert_eq!(got.as_deref(), Some(&42));
    }
}
