//! Who may hold one of the metrics port's connections. The port is open to every local user,
//! and a connection that has not sent its whole request head yet costs its sender nothing: a
//! few hundred half-sent requests, reopened as soon as they are dropped, would keep every slot
//! taken, and a cap that closes new connections on accept would then close the scrapes. So a
//! full cap evicts instead: the oldest connection still waiting for its head goes (a scraper
//! sends its head at once, so it is the youngest, never the oldest), and a new connection is
//! refused only while every slot is answering a request it received. Each peer address may hold
//! at most half the slots, so a remote flooder leaves room for others; local peers all come from
//! the loopback address, for them the eviction is what keeps a scrape getting through.
//!
//! Bookkeeping only, under a short lock: the accept loop never waits on a connection.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

pub(super) struct Admission {
    max_total: usize,
    max_per_peer: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    next_id: u64,
    /// By id, which is the order of acceptance: the first entry is the oldest.
    conns: BTreeMap<u64, Conn>,
    per_peer: HashMap<IpAddr, usize>,
}

struct Conn {
    peer: IpAddr,
    waiting_for_head: bool,
    /// Dropped to evict: the connection's task sees its receiver end.
    _evict: oneshot::Sender<()>,
}

/// A connection's slot, given back when dropped.
pub(super) struct Ticket {
    admission: Arc<Admission>,
    id: u64,
}

impl Admission {
    pub(super) fn new(max_total: usize) -> Arc<Self> {
        let max_total = max_total.max(1);
        Arc::new(Admission {
            max_total,
            max_per_peer: (max_total / 2).max(1),
            inner: Mutex::default(),
        })
    }

    /// A slot for a connection from `peer`, evicting the oldest half-sent connection (the
    /// peer's own first) if the caps are reached; `None` when none can be evicted. The receiver
    /// ends when the connection is evicted.
    pub(super) fn admit(self: &Arc<Self>, peer: IpAddr) -> Option<(Ticket, oneshot::Receiver<()>)> {
        let peer = peer.to_canonical();
        let mut inner = self.lock();
        if inner.per_peer.get(&peer).copied().unwrap_or(0) >= self.max_per_peer
            && !inner.evict_oldest(|c| c.peer == peer)
        {
            return None;
        }
        if inner.conns.len() >= self.max_total && !inner.evict_oldest(|_| true) {
            return None;
        }
        let (tx, rx) = oneshot::channel();
        let id = inner.next_id;
        inner.next_id += 1;
        inner.conns.insert(
            id,
            Conn {
                peer,
                waiting_for_head: true,
                _evict: tx,
            },
        );
        *inner.per_peer.entry(peer).or_default() += 1;
        let ticket = Ticket {
            admission: Arc::clone(self),
            id,
        };
        Some((ticket, rx))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Inner {
    /// Evicts the oldest connection still waiting for its head among those `which` picks.
    fn evict_oldest(&mut self, which: impl Fn(&Conn) -> bool) -> bool {
        let oldest = self
            .conns
            .iter()
            .find(|(_, c)| c.waiting_for_head && which(c))
            .map(|(id, _)| *id);
        match oldest {
            Some(id) => {
                self.remove(id);
                super::families::EVICTED.inc();
                true
            }
            None => false,
        }
    }

    fn remove(&mut self, id: u64) {
        let Some(conn) = self.conns.remove(&id) else {
            return;
        };
        if let Some(n) = self.per_peer.get_mut(&conn.peer) {
            *n -= 1;
            if *n == 0 {
                self.per_peer.remove(&conn.peer);
            }
        }
    }
}

impl Ticket {
    /// The whole head arrived: from now on the connection is answered, never evicted. `false`
    /// when it was evicted first.
    pub(super) fn head_received(&self) -> bool {
        let mut inner = self.admission.lock();
        match inner.conns.get_mut(&self.id) {
            Some(c) => {
                c.waiting_for_head = false;
                true
            }
            None => false,
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.admission.lock().remove(self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOCAL: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
    const REMOTE: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 7));

    #[test]
    fn a_full_cap_evicts_the_oldest_half_sent_connection() {
        let a = Admission::new(4);
        let mut held: Vec<_> = (0..2).map(|_| a.admit(LOCAL).unwrap()).collect();
        // The per-peer cap (2) is reached: the next local one evicts the oldest local one.
        let (_t, _rx) = a.admit(LOCAL).expect("admitted by eviction");
        assert!(
            held[0]
                .1
                .try_recv()
                .is_err_and(|e| e == oneshot::error::TryRecvError::Closed)
        );
        assert!(
            held[1]
                .1
                .try_recv()
                .is_err_and(|e| e == oneshot::error::TryRecvError::Empty)
        );
        assert!(super::super::families::EVICTED.get() >= 1);
        held.remove(0);
        assert!(a.admit(REMOTE).is_some());
    }

    #[test]
    fn connections_being_answered_are_never_evicted() {
        let a = Admission::new(2);
        let one = a.admit(LOCAL).unwrap();
        assert!(one.0.head_received());
        // The only local slot is answering: a new local connection is refused, not admitted.
        assert!(a.admit(LOCAL).is_none());
        let two = a.admit(REMOTE).unwrap();
        assert!(two.0.head_received());
        assert!(a.admit(REMOTE).is_none());
        drop(one);
        assert!(a.admit(LOCAL).is_some());
    }

    #[test]
    fn an_evicted_connection_cannot_start_answering() {
        let a = Admission::new(2);
        let (first, _rx) = a.admit(LOCAL).unwrap();
        let _second = a.admit(LOCAL).unwrap();
        assert!(!first.head_received());
        drop(first);
        assert_eq!(a.lock().conns.len(), 1);
    }
}
