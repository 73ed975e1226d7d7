//! Flushing a view of a volume's bytes. Writes in its page cache must reach the bytes before a
//! blank proof, whatever its backing (a sixty-first fresh review's F1: a loop device over a FUSE
//! passthrough of the volume's file was skipped, and its writes formatted over); but a flush
//! that reaches a FUSE, NFS or overlayfs file, directly or through the devices it is laid over,
//! is a request to that filesystem's server, with no bound (a sixtieth fresh review's F1: one
//! that never answered hung every stage on the node; the sixty-second's: through a loop device
//! laid over such a loop device, which looks told). So every flush runs on a thread of its own,
//! waited for `WITHIN`: past that the take is refused (never let through unflushed), and while
//! it still waits every later take of any volume is refused at once, without a second thread.
//! A flush that fails is let be: the server is gone, and nothing of that cache can reach any
//! file through it any more.

use std::collections::BTreeSet;
use std::fs::File;
use std::io;
use std::sync::{Mutex, mpsc};
use std::time::Duration;

use ebs_node_core::DevNum;

/// How long a flush is waited for.
const WITHIN: Duration = Duration::from_secs(2);

/// The views whose flush is still waiting on their server.
static WAITING: Mutex<BTreeSet<DevNum>> = Mutex::new(BTreeSet::new());

fn waiting() -> std::sync::MutexGuard<'static, BTreeSet<DevNum>> {
    WAITING.lock().unwrap_or_else(|p| p.into_inner())
}

/// Flushes `view` (the device `devnum`), waiting `WITHIN` at most; `Err` when it did not finish.
/// A flush that fails is an error only for a view whose backing is `told` (a local file or
/// device); for the others it means their server is gone.
pub fn bounded(devnum: DevNum, view: &File, told: bool) -> io::Result<()> {
    if !waiting().insert(devnum) {
        return Err(io::Error::other(
            "an earlier flush of it still waits on the server of its backing file",
        ));
    }
    let file = match view.try_clone() {
        Ok(f) => f,
        Err(e) => {
            waiting().remove(&devnum);
            return Err(e);
        }
    };
    let (done, answer) = mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("view-flush".into())
        .spawn(move || {
            let flushed = file.sync_all();
            waiting().remove(&devnum);
            let _ = done.send(flushed);
        });
    if let Err(e) = spawned {
        waiting().remove(&devnum);
        return Err(e);
    }
    match answer.recv_timeout(WITHIN) {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) if told => Err(e),
        Ok(Err(e)) => {
            tracing::info!(view = %devnum, error = %e,
                "a view of unknown backing could not be flushed: its server is gone, so nothing of its cache reaches any file");
            Ok(())
        }
        Err(_) => Err(io::Error::other(format!(
            "its flush did not finish within {} s (the server of a file behind it does not \
             answer); a view that may show the volume's bytes is never let through unflushed",
            WITHIN.as_secs()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A flush that answers is waited for, and leaves nothing waiting behind it.
    #[test]
    fn a_flush_that_answers_is_waited_for_and_forgotten() {
        let dir = std::env::temp_dir().join(format!("ebs-flush-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f");
        std::fs::write(&path, b"x").unwrap();
        let file = File::open(&path).unwrap();
        let devnum = DevNum::new(4095, 4095);
        bounded(devnum, &file, true).expect("flushed");
        bounded(devnum, &file, true).expect("flushed again: nothing still waits");
        assert!(!waiting().contains(&devnum));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// While a flush of a view still waits, another take of it is refused at once.
    #[test]
    fn a_view_whose_flush_still_waits_is_refused_at_once() {
        let devnum = DevNum::new(4094, 4094);
        waiting().insert(devnum);
        let file = File::open("/proc/self/stat").unwrap();
        let e = bounded(devnum, &file, true).expect_err("a second flush beside the first");
        assert!(e.to_string().contains("still waits"), "{e}");
        waiting().remove(&devnum);
    }
}
