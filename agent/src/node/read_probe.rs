//! The health read of a device, bounded in time. An impaired volume can leave a read hanging in
//! the kernel for minutes; stats must still answer, and repeated stats calls must not pile up
//! stuck threads. So the read runs on its own thread, the caller waits a moment for it, and while
//! one read of a device is outstanding no second one is started.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock, mpsc};
use std::time::{Duration, Instant};

use crate::host::direct_read;

/// How long a stats call waits for the read: a healthy device answers 4 KiB in milliseconds.
pub const READ_WAIT: Duration = Duration::from_secs(2);
const PROBE_BYTES: usize = 4096;

pub enum ReadOutcome {
    Ok,
    Failed(io::Error),
    /// A read of the device started this long ago has not returned.
    Hanging(Duration),
}

fn outstanding() -> &'static Mutex<HashMap<PathBuf, Instant>> {
    static OUTSTANDING: OnceLock<Mutex<HashMap<PathBuf, Instant>>> = OnceLock::new();
    OUTSTANDING.get_or_init(Default::default)
}

/// Reads the first 4 KiB of `device` with O_DIRECT, waiting at most `wait`.
pub fn probe(device: &Path, wait: Duration) -> ReadOutcome {
    {
        let mut reads = outstanding().lock().unwrap_or_else(|p| p.into_inner());
        if let Some(since) = reads.get(device) {
            return ReadOutcome::Hanging(since.elapsed());
        }
        reads.insert(device.to_path_buf(), Instant::now());
    }
    let (tx, rx) = mpsc::channel();
    let path = device.to_path_buf();
    let spawned = std::thread::Builder::new()
        .name("health-read".into())
        .spawn(move || {
            let result = direct_read::read_direct(&path, 0, PROBE_BYTES);
            outstanding()
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&path);
            // The caller may have stopped waiting: nothing to tell then.
            let _ = tx.send(result);
        });
    if let Err(e) = spawned {
        outstanding()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(device);
        return ReadOutcome::Failed(e);
    }
    match rx.recv_timeout(wait) {
        Ok(Ok(_)) => ReadOutcome::Ok,
        Ok(Err(e)) => ReadOutcome::Failed(e),
        Err(_) => ReadOutcome::Hanging(wait),
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
