//! The health read of a device, bounded in time. An impaired volume can leave a read hanging in
//! the kernel for minutes; stats must still answer, and repeated stats calls must not pile up
//! stuck threads. So the read runs on a reader thread, the caller waits a moment for it, and while
//! one read of a device is outstanding no second one is started.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock, mpsc};
use std::time::{Duration, Instant};

use ebs_node_core::seam::ReadOutcome;

use crate::direct_read;

/// How long a stats call waits for the read: a healthy device answers 4 KiB in milliseconds.
pub const READ_WAIT: Duration = Duration::from_secs(2);
const PROBE_BYTES: usize = 4096;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn outstanding() -> &'static Mutex<HashMap<PathBuf, Instant>> {
    static OUTSTANDING: OnceLock<Mutex<HashMap<PathBuf, Instant>>> = OnceLock::new();
    OUTSTANDING.get_or_init(Default::default)
}

/// Reads the first 4 KiB of `device` with O_DIRECT, waiting at most `wait`.
pub fn probe(device: &Path, wait: Duration) -> ReadOutcome {
    {
        let mut reads = lock(outstanding());
        if let Some(since) = reads.get(device) {
            return ReadOutcome::Hanging(since.elapsed());
        }
        reads.insert(device.to_path_buf(), Instant::now());
    }
    let (tx, rx) = mpsc::channel();
    if let Err(e) = readers::submit(device.to_path_buf(), tx) {
        lock(outstanding()).remove(device);
        return ReadOutcome::Failed(e);
    }
    match rx.recv_timeout(wait) {
        Ok(Ok(_)) => ReadOutcome::Ok,
        Ok(Err(e)) if e.raw_os_error() == Some(libc::EIO) => ReadOutcome::IoError(e),
        Ok(Err(e)) => ReadOutcome::Failed(e),
        Err(_) => ReadOutcome::Hanging(wait),
    }
}

/// Reader threads, kept for a while once idle: kubelet asks every volume's stats every minute,
/// and a thread per read cost a clone, a stack mapping and its unmapping (a TLB shootdown on
/// every core) each time. A reader stuck in a hanging read is simply not idle, so the next
/// read gets another thread and never queues behind it.
mod readers {
    use super::*;

    type Job = (PathBuf, mpsc::Sender<io::Result<Vec<u8>>>);

    /// How long an idle reader waits for work before it exits.
    const KEEP_IDLE: Duration = Duration::from_secs(120);

    /// An idle reader: its id and the sender of its own job queue.
    type Idle = (u64, mpsc::Sender<Job>);

    pub(super) fn idle() -> &'static Mutex<Vec<Idle>> {
        static IDLE: OnceLock<Mutex<Vec<Idle>>> = OnceLock::new();
        IDLE.get_or_init(Default::default)
    }

    pub(super) fn submit(
        path: PathBuf,
        reply: mpsc::Sender<io::Result<Vec<u8>>>,
    ) -> io::Result<()> {
        let mut job = (path, reply);
        loop {
            // The list's lock is released before the send.
            let Some((_, reader)) = lock(idle()).pop() else {
                break;
            };
            match reader.send(job) {
                Ok(()) => return Ok(()),
                // That reader is gone (it cannot be: it leaves the list before it exits).
                Err(mpsc::SendError(back)) => job = back,
            }
        }
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let id = NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        std::thread::Builder::new()
            .name("health-read".into())
            .spawn(move || serve(id, job))
            .map(drop)
    }

    fn serve(id: u64, first: Job) {
        let (tx, rx) = mpsc::channel::<Job>();
        let mut job = first;
        loop {
            let (path, reply) = job;
            let result = direct_read::read_direct(&path, 0, PROBE_BYTES);
            lock(outstanding()).remove(&path);
            // Idle again before the caller hears back, so its next read can reuse this thread.
            lock(idle()).push((id, tx.clone()));
            // The caller may have stopped waiting: nothing to tell then.
            let _ = reply.send(result);
            job = match rx.recv_timeout(KEEP_IDLE) {
                Ok(next) => next,
                Err(_) => {
                    let mut list = lock(idle());
                    match list.iter().position(|(i, _)| *i == id) {
                        Some(at) => {
                            list.swap_remove(at);
                            return;
                        }
                        // A caller took this reader off the list just now: its job is coming.
                        None => {
                            drop(list);
                            match rx.recv() {
                                Ok(next) => next,
                                Err(_) => return,
                            }
                        }
                    }
                }
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_device_fails_and_leaves_nothing_outstanding() {
        let dev = Path::new("/nonexistent/device-for-read-probe");
        assert!(matches!(probe(dev, READ_WAIT), ReadOutcome::Failed(_)));
        assert!(matches!(probe(dev, READ_WAIT), ReadOutcome::Failed(_)));
    }

    #[test]
    fn a_reader_thread_is_reused() {
        let dev = Path::new("/nonexistent/device-for-reader-reuse");
        assert!(matches!(probe(dev, READ_WAIT), ReadOutcome::Failed(_)));
        // Other tests may hold readers too; at least the one that just answered is idle.
        assert!(!lock(readers::idle()).is_empty());
        assert!(matches!(probe(dev, READ_WAIT), ReadOutcome::Failed(_)));
        assert!(!lock(readers::idle()).is_empty());
    }

    #[test]
    fn an_outstanding_read_is_not_repeated() {
        let dev = Path::new("/dev/pretend-hanging");
        let started = Instant::now() - Duration::from_secs(30);
        outstanding()
            .lock()
            .unwrap()
            .insert(dev.to_path_buf(), started);
        match probe(dev, READ_WAIT) {
            ReadOutcome::Hanging(d) => assert!(d >= Duration::from_secs(30)),
            _ => panic!("expected Hanging"),
        }
        outstanding().lock().unwrap().remove(dev);
    }
}
