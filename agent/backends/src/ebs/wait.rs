//! Waiting for a device: look, and when it is not there, sleep until the kernel announces a block
//! device (a netlink uevent: needs no udevd) or a short tick passes, then look again, until the
//! deadline. The tick covers what uevents cannot: agents in a network namespace other than the
//! host's get no kernel uevents, and fixture trees change without any.

use std::time::{Duration, Instant};

use ebs_node_host::ready::readable_within;

/// Longest sleep between two looks when no uevent arrives.
pub const TICK: Duration = Duration::from_millis(250);

/// A kernel uevent listener for block devices; without one (no permission, odd namespace) the
/// wait falls back to the tick alone.
pub struct UeventWatch {
    socket: Option<udev::MonitorSocket>,
}

impl UeventWatch {
    pub fn open() -> Self {
        let socket = udev::MonitorBuilder::new_kernel()
            .and_then(|b| b.match_subsystem("block"))
            .and_then(|b| b.listen());
        match socket {
            Ok(s) => UeventWatch { socket: Some(s) },
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen to kernel uevents; rescanning every {TICK:?} instead");
                UeventWatch { socket: None }
            }
        }
    }

    /// Sleeps until a block uevent arrives or `until` (at most one tick away) passes. Returns
    /// how many uevents arrived.
    pub fn wait(&mut self, until: Instant) -> usize {
        let now = Instant::now();
        let nap = until.saturating_duration_since(now).min(TICK);
        let Some(socket) = &self.socket else {
            std::thread::sleep(nap);
            return 0;
        };
        match readable_within(socket, nap) {
            Ok(false) => 0,
            // The socket is non-blocking: drain every queued event, one rescan covers them all.
            Ok(true) => socket.iter().count(),
            Err(e) => {
                tracing::debug!(error = %e, "poll on the uevent socket failed");
                std::thread::sleep(nap);
                0
            }
        }
    }
}

/// What one look found.
pub enum Look<T, S> {
    Found(T),
    NotYet(S),
}

/// How a wait went, for the log line of a resolve.
#[derive(Clone, Copy, Debug, Default)]
pub struct WaitStats {
    pub looks: u32,
    pub uevents: usize,
}

/// Looks until `look` finds something or `deadline` passes; returns the last "not yet" state so
/// the caller can say what was seen. The uevent socket is opened after the first miss and before
/// the second look, so an event between the two cannot be lost.
pub fn until_found<T, S, E>(
    deadline: Instant,
    stats: &mut WaitStats,
    mut look: impl FnMut() -> Result<Look<T, S>, E>,
) -> Result<Result<T, S>, E> {
    let mut watch: Option<UeventWatch> = None;
    loop {
        stats.looks += 1;
        let seen = match look()? {
            Look::Found(t) => return Ok(Ok(t)),
            Look::NotYet(s) => s,
        };
        if Instant::now() >= deadline {
            return Ok(Err(seen));
        }
        match &mut watch {
            None => {
                tracing::info!(
                    wait_ms = deadline
                        .saturating_duration_since(Instant::now())
                        .as_millis() as u64,
                    "device not there yet; waiting for it (kernel uevents and rescans)"
                );
                watch = Some(UeventWatch::open());
            }
            Some(w) => stats.uevents += w.wait(deadline),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gives_up_at_the_deadline_with_the_last_state() {
        let deadline = Instant::now() + Duration::from_millis(300);
        let mut looks = 0;
        let r: Result<Result<(), u32>, ()> =
            until_found(deadline, &mut WaitStats::default(), || {
                looks += 1;
                Ok(Look::NotYet(looks))
            });
        assert!(Instant::now() >= deadline);
        assert!(matches!(r, Ok(Err(n)) if n >= 2));
    }

    #[test]
    fn returns_as_soon_as_found() {
        let mut looks = 0;
        let r: Result<Result<u32, ()>, ()> = until_found(
            Instant::now() + Duration::from_secs(10),
            &mut WaitStats::default(),
            || {
                looks += 1;
                Ok(if looks == 3 {
                    Look::Found(looks)
                } else {
                    Look::NotYet(())
                })
            },
        );
        assert!(matches!(r, Ok(Ok(3))));
    }
}
