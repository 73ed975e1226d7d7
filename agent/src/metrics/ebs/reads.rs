//! Page reads in parallel, each on a thread of its own with a deadline. A read that misses its
//! deadline is abandoned, not waited for: its thread stays in the ioctl until the kernel's own
//! timeout, and its device is marked busy until then, so a stuck controller holds at most one
//! thread however often it is scraped, and neither the scrape nor the other volumes wait on it.
//! The threads are the agent's own, not tokio's blocking pool, which the CSI calls need.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::host::nvme::{ReadError, ebs_page};

/// Reads one device's raw statistics page (blocking). The agent's reader is the ioctl; tests
/// and benches stub it.
pub trait PageReader: Send + Sync + 'static {
    fn read_page(&self, device: &Path) -> Result<Vec<u8>, ReadError>;
}

/// The real reader: Get Log Page 0xD0 through `NVME_IOCTL_ADMIN_CMD`.
pub struct NvmeReader {
    /// The command's timeout in the kernel. Longer than a scrape waits: when an admin command
    /// times out, the kernel resets the controller, which must not happen to a volume in use
    /// because a metrics scrape was impatient.
    pub ioctl_timeout: Duration,
}

impl PageReader for NvmeReader {
    fn read_page(&self, device: &Path) -> Result<Vec<u8>, ReadError> {
        ebs_page::read(device, self.ioctl_timeout)
    }
}

/// Devices with a read in progress, across scrapes.
#[derive(Clone, Default)]
pub struct InFlight(Arc<Mutex<HashSet<PathBuf>>>);

struct Claim {
    set: InFlight,
    device: PathBuf,
}

impl InFlight {
    fn claim(&self, device: &Path) -> Option<Claim> {
        let mut set = self.0.lock().unwrap_or_else(|p| p.into_inner());
        set.insert(device.to_path_buf()).then(|| Claim {
            set: self.clone(),
            device: device.to_path_buf(),
        })
    }

    pub fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut set = self.set.0.lock().unwrap_or_else(|p| p.into_inner());
        set.remove(&self.device);
    }
}

#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Reads waited on at once.
    pub parallel: usize,
    /// How long one read is waited for, from its start.
    pub per_read: Duration,
    /// How long the whole scrape waits; reads not started by then count as timed out.
    pub budget: Duration,
}

#[derive(Debug)]
pub enum Outcome {
    Page(Vec<u8>),
    Failed(ReadError),
    /// Not answered within its deadline (or never started within the scrape's budget).
    TimedOut,
    /// A read of this device from an earlier scrape is still stuck in the kernel.
    Busy,
    /// No thread could be started.
    NoThread(String),
}

/// Reads every device's page, at most `limits.parallel` at a time; one outcome per device, in
/// order.
pub fn read_all(
    reader: &Arc<dyn PageReader>,
    in_flight: &InFlight,
    devices: &[PathBuf],
    limits: Limits,
) -> Vec<Outcome> {
    let mut out: Vec<Option<Outcome>> = devices.iter().map(|_| None).collect();
    let budget_end = Instant::now() + limits.budget;
    let (tx, rx) = mpsc::channel();
    let mut active: Vec<(usize, Instant)> = Vec::new();
    let mut next = 0;
    loop {
        let now = Instant::now();
        while active.len() < limits.parallel.max(1) && next < devices.len() && now < budget_end {
            match start(next, &devices[next], reader, in_flight, &tx) {
                Ok(()) => active.push((next, now + limits.per_read)),
                Err(o) => out[next] = Some(o),
            }
            next += 1;
        }
        if active.is_empty() {
            break;
        }
        let wake = active
            .iter()
            .map(|(_, deadline)| *deadline)
            .min()
            .unwrap_or(now)
            .min(budget_end);
        match rx.recv_timeout(wake.saturating_duration_since(now)) {
            Ok((i, result)) => {
                // A late answer of an abandoned read finds its slot already closed.
                if let Some(pos) = active.iter().position(|(j, _)| *j == i) {
                    active.swap_remove(pos);
                    out[i] = Some(match result {
                        Ok(page) => Outcome::Page(page),
                        Err(e) => Outcome::Failed(e),
                    });
                }
            }
            Err(RecvTimeoutError::Timeout) => {
                let now = Instant::now();
                active.retain(|(i, deadline)| {
                    let expired = *deadline <= now || now >= budget_end;
                    if expired {
                        out[*i] = Some(Outcome::TimedOut);
                    }
                    !expired
                });
            }
            // Unreachable while `tx` lives; give up on the rest rather than spin.
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    out.into_iter()
        .map(|o| o.unwrap_or(Outcome::TimedOut))
        .collect()
}

type Answer = (usize, Result<Vec<u8>, ReadError>);

fn start(
    index: usize,
    device: &Path,
    reader: &Arc<dyn PageReader>,
    in_flight: &InFlight,
    tx: &mpsc::Sender<Answer>,
) -> Result<(), Outcome> {
    let claim = in_flight.claim(device).ok_or(Outcome::Busy)?;
    let reader = Arc::clone(reader);
    let tx = tx.clone();
    std::thread::Builder::new()
        .name("ebs-stats".into())
        .stack_size(128 * 1024)
        .spawn(move || {
            let result = reader.read_page(&claim.device);
            drop(claim);
            let _ = tx.send((index, result));
        })
        .map(|_| ())
        .map_err(|e| Outcome::NoThread(e.to_string()))
}
