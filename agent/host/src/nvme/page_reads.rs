//! Page reads in parallel on a few threads of the scrape's own, each read with a deadline. A
//! read that misses its deadline is abandoned, not waited for: its thread stays in the ioctl
//! until the kernel's own timeout, and its device is marked busy until then, so a stuck
//! controller holds at most one thread however often it is scraped, and neither the scrape nor
//! the other volumes wait on it. The threads are the agent's own, not tokio's blocking pool,
//! which the CSI calls need.

use std::collections::{HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{ReadError, ebs_page};

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
/// order. `parallel` workers take devices off a shared queue; a worker whose read misses its
/// deadline is abandoned to the kernel and another one started in its place, so stuck devices
/// never take the others' turn.
pub fn read_all(
    reader: &Arc<dyn PageReader>,
    in_flight: &InFlight,
    devices: &[PathBuf],
    limits: Limits,
) -> Vec<Outcome> {
    let mut out: Vec<Option<Outcome>> = devices.iter().map(|_| None).collect();
    let budget_end = Instant::now() + limits.budget;
    let mut queue = VecDeque::new();
    for (i, device) in devices.iter().enumerate() {
        match in_flight.claim(device) {
            Some(claim) => queue.push_back((i, claim)),
            None => out[i] = Some(Outcome::Busy),
        }
    }
    let waiting = queue.len();
    let queue: Queue = Arc::new(Mutex::new(queue));
    let (tx, rx) = mpsc::channel();
    // Reads started and not yet answered, with their deadlines.
    let mut active: Vec<(usize, Instant)> = Vec::new();
    let mut answered = 0;
    for _ in 0..limits.parallel.max(1).min(waiting) {
        if let Err(e) = spawn_worker(reader, &queue, &tx) {
            answered += fail_queued(&queue, &mut out, &e);
            break;
        }
    }
    while answered < waiting {
        let now = Instant::now();
        if now >= budget_end {
            break;
        }
        let wake = active
            .iter()
            .map(|(_, deadline)| *deadline)
            .min()
            .unwrap_or(budget_end)
            .min(budget_end);
        match rx.recv_timeout(wake.saturating_duration_since(now)) {
            Ok(Event::Started(i)) => active.push((i, Instant::now() + limits.per_read)),
            Ok(Event::Done(i, result)) => {
                // A late answer of an abandoned read finds its slot already closed.
                if let Some(pos) = active.iter().position(|(j, _)| *j == i) {
                    active.swap_remove(pos);
                    answered += 1;
                    out[i] = Some(match result {
                        Ok(page) => Outcome::Page(page),
                        Err(e) => Outcome::Failed(e),
                    });
                }
            }
            Err(RecvTimeoutError::Timeout) => {
                let now = Instant::now();
                let mut abandoned = 0;
                active.retain(|(i, deadline)| {
                    let expired = *deadline <= now;
                    if expired {
                        out[*i] = Some(Outcome::TimedOut);
                        abandoned += 1;
                    }
                    !expired
                });
                answered += abandoned;
                for _ in 0..abandoned {
                    if let Err(e) = spawn_worker(reader, &queue, &tx) {
                        answered += fail_queued(&queue, &mut out, &e);
                    }
                }
            }
            // Every worker is gone: nothing more will come.
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    // The budget is spent: what has not started never will (its claim is released here).
    queue.lock().unwrap_or_else(|p| p.into_inner()).clear();
    out.into_iter()
        .map(|o| o.unwrap_or(Outcome::TimedOut))
        .collect()
}

type Queue = Arc<Mutex<VecDeque<(usize, Claim)>>>;

enum Event {
    Started(usize),
    Done(usize, Result<Vec<u8>, ReadError>),
}

/// No thread could be started: the reads still queued will not happen. Returns how many.
fn fail_queued(queue: &Queue, out: &mut [Option<Outcome>], why: &str) -> usize {
    let mut queue = queue.lock().unwrap_or_else(|p| p.into_inner());
    let n = queue.len();
    for (i, _) in queue.drain(..) {
        out[i] = Some(Outcome::NoThread(why.to_string()));
    }
    n
}

fn spawn_worker(
    reader: &Arc<dyn PageReader>,
    queue: &Queue,
    tx: &mpsc::Sender<Event>,
) -> Result<(), String> {
    let reader = Arc::clone(reader);
    let queue = Arc::clone(queue);
    let tx = tx.clone();
    std::thread::Builder::new()
        .name("ebs-stats".into())
        .stack_size(128 * 1024)
        .spawn(move || {
            loop {
                let job = queue.lock().unwrap_or_else(|p| p.into_inner()).pop_front();
                let Some((i, claim)) = job else { break };
                if tx.send(Event::Started(i)).is_err() {
                    break;
                }
                let result = reader.read_page(&claim.device);
                drop(claim);
                if tx.send(Event::Done(i, result)).is_err() {
                    break;
                }
            }
        })
        .map(|_| ())
        .map_err(|e| e.to_string())
}
