//! The namespaces whose mounts changed after they were read, read again until none has. The
//! scan reads one namespace at a time, so a bind made in a namespace already read and taken
//! away from one not read yet (a bind kept up at every moment, hopping between two namespaces
//! as the scan moves: a fiftieth fresh review's F1, 13 stages in 20 taken) was in no table the
//! scan read. Every table stays open from just before it was read, and the kernel marks it
//! (POLLPRI) once its namespace mounts or unmounts anything; those are read again, their finds
//! added to the scan's, until a round finds none changed: then every namespace's last read is
//! its state now, so a bind that lives at every moment is in one of them. A round of changes
//! after `ROUNDS` is let be (a busy node mounts all the time: the agent's own calls do), found
//! as far as the reads went: a hop must then win every round in a row.

use std::fs::File;
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use super::{Found, Namespaces, read_all, read_one};

/// How many rounds of reading again a scan takes at most.
const ROUNDS: usize = 8;
/// How long a scan, from its start, goes on reading again: one user's namespace of 60,000
/// mounts, mounting and unmounting all the time, took every scan past its 5 s (a fifty-first
/// fresh review's F2).
const BUDGET: Duration = Duration::from_secs(1);

/// A namespace read: its table, open since just before the read, and where its file is.
pub(super) struct Watched {
    pub table: File,
    /// Its index in `Namespaces::kept`.
    pub ns: usize,
    pub at: String,
}

/// Reads again every namespace whose mounts changed since it was read (and any namespace
/// those reads find), until a round finds none changed, or for `ROUNDS` rounds.
pub(super) fn read_changed(
    found: &mut Found,
    spaces: &mut Namespaces,
    started: Instant,
) -> Result<(), String> {
    for _ in 0..ROUNDS {
        if started.elapsed() > BUDGET {
            return Ok(());
        }
        let changed = changed(&spaces.watched)?;
        if changed.is_empty() {
            return Ok(());
        }
        for i in changed {
            let at = spaces.watched[i].at.clone();
            let ns = spaces.kept[spaces.watched[i].ns]
                .try_clone()
                .map_err(|e| format!("the mount namespace {at}: {e}"))?;
            let (table, nested) = read_one(found, ns.as_fd(), &at)?;
            spaces.watched[i].table = table;
            for (f, at) in nested {
                spaces.pin(f, at)?;
            }
        }
        read_all(found, spaces)?;
    }
    Ok(())
}

/// The indices of the namespaces whose mounts changed since their tables were opened.
fn changed(watched: &[Watched]) -> Result<Vec<usize>, String> {
    let mut fds: Vec<PollFd<'_>> = watched
        .iter()
        .map(|w| PollFd::new(w.table.as_fd(), PollFlags::POLLPRI))
        .collect();
    poll(&mut fds, PollTimeout::ZERO)
        .map_err(|e| format!("asking whether the mount tables changed: {e}"))?;
    let marked = PollFlags::POLLPRI | PollFlags::POLLERR;
    Ok(fds
        .iter()
        .enumerate()
        .filter(|(_, fd)| fd.revents().is_some_and(|r| r.intersects(marked)))
        .map(|(i, _)| i)
        .collect())
}
