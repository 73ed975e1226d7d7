//! Every open connection of one socket, and the rules that close the ones holding a slot
//! without a call. Owned by the socket's accept task alone; each connection's own state is
//! shared with its I/O (which fails once closed) and with its calls (which mark it busy).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::Waker;
use std::time::{Duration, Instant};

use super::{ANSWER_DEADLINE, HANDSHAKE_DEADLINE, IDLE_TIMEOUT, PREFACE_LEN};

/// At the cap, how long an answer must have waited before its connection goes first: more than
/// any reading client takes to take one.
const UNREAD_AT_THE_CAP: Duration = Duration::from_secs(1);

pub(crate) struct Conn {
    accepted: Instant,
    /// Bytes of the client preface not yet read.
    preface_left: AtomicUsize,
    /// Calls being served: request received, answer not yet sent.
    calls: AtomicUsize,
    /// When the last call ended (the accept, before the first).
    idle_since: Mutex<Instant>,
    /// Answers ready but not yet taken by the client, by number (oldest first): since when.
    unread: Mutex<BTreeMap<u64, Instant>>,
    next_answer: AtomicU64,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Why the connection is to close; its I/O fails from then on.
    closed: Option<&'static str>,
    /// Its I/O is dropped: the slot is free.
    gone: bool,
    /// The connection task, woken to see the closure.
    waker: Option<Waker>,
}

impl Conn {
    fn new(now: Instant) -> Self {
        Conn {
            accepted: now,
            preface_left: AtomicUsize::new(PREFACE_LEN),
            calls: AtomicUsize::new(0),
            idle_since: Mutex::new(now),
            unread: Mutex::default(),
            next_answer: AtomicU64::new(0),
            state: Mutex::default(),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Why the connection is closed, if it is; otherwise `waker` is woken when it is.
    pub(super) fn closed_for(&self, waker: &Waker) -> Option<&'static str> {
        let mut s = self.state();
        if s.closed.is_none() && !s.waker.as_ref().is_some_and(|w| w.will_wake(waker)) {
            s.waker = Some(waker.clone());
        }
        s.closed
    }

    /// Closes the connection (its next read or write fails); false if it already was.
    pub(super) fn close(&self, why: &'static str) -> bool {
        let mut s = self.state();
        if s.gone || s.closed.is_some() {
            return false;
        }
        s.closed = Some(why);
        if let Some(w) = s.waker.take() {
            w.wake();
        }
        true
    }

    pub(super) fn gone(&self) {
        self.state().gone = true;
    }

    fn is_live(&self) -> bool {
        let s = self.state();
        !s.gone && s.closed.is_none()
    }

    /// `n` more bytes read from the client.
    pub(super) fn received(&self, n: usize) {
        let left = self.preface_left.load(Ordering::Relaxed);
        if left > 0 {
            self.preface_left
                .store(left.saturating_sub(n), Ordering::Relaxed);
        }
    }

    pub(super) fn begin_call(&self) {
        self.calls.fetch_add(1, Ordering::SeqCst);
    }

    pub(super) fn end_call(&self) {
        let mut since = self.idle_since.lock().unwrap_or_else(|p| p.into_inner());
        if self.calls.fetch_sub(1, Ordering::SeqCst) == 1 {
            *since = Instant::now();
        }
    }

    /// A call's answer is ready to be sent: the client has [`ANSWER_DEADLINE`] to take it.
    /// Returns the number `answer_taken` names it by.
    pub(super) fn answer_ready(&self, now: Instant) -> u64 {
        let n = self.next_answer.fetch_add(1, Ordering::Relaxed);
        self.unread_answers().insert(n, now);
        n
    }

    /// The answer was sent, or abandoned.
    pub(super) fn answer_taken(&self, n: u64) {
        self.unread_answers().remove(&n);
    }

    fn unread_answers(&self) -> MutexGuard<'_, BTreeMap<u64, Instant>> {
        self.unread.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Since when the oldest answer not yet taken has waited.
    fn oldest_unread(&self) -> Option<Instant> {
        self.unread_answers().first_key_value().map(|(_, t)| *t)
    }

    /// Since when the connection has had no call, or None while it has one.
    pub(super) fn idle_since(&self) -> Option<Instant> {
        let since = self.idle_since.lock().unwrap_or_else(|p| p.into_inner());
        (self.calls.load(Ordering::SeqCst) == 0).then_some(*since)
    }
}

pub(super) struct Registry {
    cap: usize,
    conns: Vec<Weak<Conn>>,
    /// Connections closed at the cap since the last sweep (logged there).
    reclaimed: usize,
}

impl Registry {
    pub(super) fn new(cap: usize) -> Self {
        Registry {
            cap,
            conns: Vec::new(),
            reclaimed: 0,
        }
    }

    pub(super) fn register(&mut self) -> Arc<Conn> {
        if self.conns.len() > 2 * self.cap {
            self.live();
        }
        let conn = Arc::new(Conn::new(Instant::now()));
        self.conns.push(Arc::downgrade(&conn));
        conn
    }

    /// The open connections that are not closing; forgets the others.
    fn live(&mut self) -> Vec<Arc<Conn>> {
        let live: Vec<Arc<Conn>> = self
            .conns
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|c| c.is_live())
            .collect();
        self.conns = live.iter().map(Arc::downgrade).collect();
        live
    }

    /// At the cap: closes a connection that leaves an answer unread (for a second or more,
    /// oldest first), else the longest idle one, so the one waiting gets its slot. A client that
    /// does not read goes before an idle one: otherwise a stream of such clients at the cap
    /// would keep taking the slot of whoever just connected (idle until its request arrives).
    /// False when every connection has a call and reads its answers.
    pub(super) fn reclaim_one(&mut self) -> bool {
        self.reclaim_one_at(Instant::now())
    }

    pub(super) fn reclaim_one_at(&mut self, now: Instant) -> bool {
        let live = self.live();
        let unread = live
            .iter()
            .filter_map(|c| c.oldest_unread().map(|t| (t, c)))
            .filter(|(t, _)| now.saturating_duration_since(*t) >= UNREAD_AT_THE_CAP)
            .min_by_key(|(t, _)| *t)
            .map(|(_, c)| {
                (
                    c,
                    "the connection cap is reached and it left an answer unread",
                )
            });
        let chosen = unread.or_else(|| {
            live.iter()
                .filter_map(|c| c.idle_since().map(|t| (t, c)))
                .min_by_key(|(t, _)| *t)
                .map(|(_, c)| {
                    (
                        c,
                        "the connection cap is reached and it was the longest idle",
                    )
                })
        });
        match chosen {
            Some((c, why)) => {
                let closed = c.close(why);
                self.reclaimed += usize::from(closed);
                closed
            }
            None => false,
        }
    }

    /// Applies the handshake deadline, the answer deadline and, above three quarters of the
    /// cap, the idle timeout.
    pub(super) fn sweep(&mut self) {
        self.sweep_at(Instant::now());
    }

    pub(super) fn sweep_at(&mut self, now: Instant) {
        let mut live = self.live();
        let mut late = 0;
        let mut stalled = 0;
        live.retain(|c| {
            let late_preface = c.preface_left.load(Ordering::Relaxed) > 0
                && now.saturating_duration_since(c.accepted) >= HANDSHAKE_DEADLINE;
            if late_preface && c.close("no HTTP/2 preface within the handshake deadline") {
                late += 1;
                return false;
            }
            // A client that leaves an answer unread (a flow-control window of 0, a socket it
            // never reads) would hold its slot for ever, a call in flight or not: closed.
            let unread = c
                .oldest_unread()
                .is_some_and(|t| now.saturating_duration_since(t) >= ANSWER_DEADLINE);
            if unread && c.close("an answer was left unread past the answer deadline") {
                stalled += 1;
                return false;
            }
            true
        });
        let keep = self.cap * 3 / 4;
        let mut idle = 0;
        if live.len() > keep {
            let mut long_idle: Vec<(Instant, &Arc<Conn>)> = live
                .iter()
                .filter_map(|c| c.idle_since().map(|t| (t, c)))
                .filter(|(t, _)| now.saturating_duration_since(*t) >= IDLE_TIMEOUT)
                .collect();
            long_idle.sort_by_key(|(t, _)| *t);
            for (_, c) in long_idle.into_iter().take(live.len() - keep) {
                idle += usize::from(c.close("idle while the socket is nearly full"));
            }
        }
        let reclaimed = std::mem::take(&mut self.reclaimed);
        if late + stalled + idle + reclaimed > 0 {
            tracing::info!(
                late_preface = late,
                unread_answer = stalled,
                idle,
                taken_at_the_cap = reclaimed,
                open = live.len() - idle,
                cap = self.cap,
                "gRPC socket: closed connections that held a slot without a call or without reading"
            );
        }
    }
}
