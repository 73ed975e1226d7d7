//! EBS detailed performance statistics on `/metrics`, under the names, types, units and labels
//! of the upstream EBS CSI node (`aws_ebs_csi_*`, see `render`), so dashboards built on it keep
//! working. At each scrape, for every EBS volume the agent has staged or published (the state
//! file says which), the volume's NVMe device is found by its serial in sysfs and its vendor log
//! page 0xD0 is read (`reads`) and parsed (`host::nvme::ebs_page`). A failure is counted, logged
//! once per volume and reason, and never fails the scrape.

pub mod render;
mod volumes;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ebs_store::Store;

use ebs_node_backends::nodeinfo::NodeInfoSource;
use ebs_node_host::nvme::ReadError;
use ebs_node_host::nvme::ebs_page::{self, EbsStats, PageError};
use ebs_node_host::nvme::page_reads::{
    InFlight, Limits, NvmeReader, Outcome, PageReader, read_all,
};
pub use volumes::{NvmeDisk, Wanted, disks_by_serial, serial_of, wanted_volumes};

/// Bucket bounds of the collector's own duration histogram (upstream's).
pub const DURATION_BUCKETS: [f64; 13] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

#[derive(Clone, Debug)]
pub struct EbsStatsConfig {
    pub sys_root: PathBuf,
    pub dev_root: PathBuf,
    /// The controller model of an EBS volume (`--ebs-model`).
    pub model: String,
    /// `--csi-mount-point-prefix`: only volumes with a staging or target path under it. `None`:
    /// every volume the agent staged or published.
    pub mount_point_prefix: Option<PathBuf>,
    pub limits: Limits,
    /// A scrape sooner than this after the last read reuses its pages: AWS documents the page
    /// at up to one read a second, and the driver queues faster ones behind other admin commands.
    pub min_interval: Duration,
}

impl EbsStatsConfig {
    pub fn new(sys_root: PathBuf, dev_root: PathBuf, model: String) -> Self {
        EbsStatsConfig {
            sys_root,
            dev_root,
            model,
            mount_point_prefix: None,
            limits: Limits {
                parallel: 8,
                per_read: Duration::from_secs(2),
                budget: Duration::from_secs(5),
            },
            min_interval: Duration::from_secs(1),
        }
    }
}

/// The command timeout the agent gives the kernel for one page read.
pub const IOCTL_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a volume's statistics are missing from a scrape (the `reason` of
/// `ebs_agent_ebs_stats_errors_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Reason {
    /// The state file or sysfs could not be read: no volume was looked at.
    Listing,
    /// No disk has the volume's serial (detached, or not yet visible).
    NoDevice,
    /// The device is not an EBS volume: another controller model, or a page without EBS's magic.
    NotEbs,
    /// The device has no NVMe passthrough (ENOTTY, EINVAL).
    NotNvme,
    /// EPERM/EACCES: the agent lacks CAP_SYS_ADMIN or access to the node.
    Permission,
    /// The controller rejected the command (it does not implement the page).
    Unsupported,
    ShortPage,
    /// A field out of its bounds (histogram bins).
    BadPage,
    Timeout,
    /// A read from an earlier scrape is still stuck in the kernel.
    Busy,
    Io,
}

impl Reason {
    pub const ALL: [Reason; 11] = [
        Reason::Listing,
        Reason::NoDevice,
        Reason::NotEbs,
        Reason::NotNvme,
        Reason::Permission,
        Reason::Unsupported,
        Reason::ShortPage,
        Reason::BadPage,
        Reason::Timeout,
        Reason::Busy,
        Reason::Io,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Listing => "listing",
            Reason::NoDevice => "no_device",
            Reason::NotEbs => "not_ebs",
            Reason::NotNvme => "not_nvme",
            Reason::Permission => "permission",
            Reason::Unsupported => "unsupported",
            Reason::ShortPage => "short_page",
            Reason::BadPage => "bad_page",
            Reason::Timeout => "timeout",
            Reason::Busy => "busy",
            Reason::Io => "io",
        }
    }

    fn of_read(e: &ReadError) -> Reason {
        use nix::errno::Errno;
        match e {
            ReadError::Open { source, .. } => match source.kind() {
                std::io::ErrorKind::NotFound => Reason::NoDevice,
                std::io::ErrorKind::PermissionDenied => Reason::Permission,
                _ => Reason::Io,
            },
            ReadError::Ioctl(Errno::ENOTTY | Errno::EINVAL | Errno::EOPNOTSUPP) => Reason::NotNvme,
            ReadError::Ioctl(Errno::EPERM | Errno::EACCES) => Reason::Permission,
            ReadError::Ioctl(Errno::EINTR | Errno::ETIMEDOUT) => Reason::Timeout,
            ReadError::Ioctl(_) | ReadError::Length(_) => Reason::Io,
            ReadError::Status(_) => Reason::Unsupported,
        }
    }

    fn of_page(e: &PageError) -> Reason {
        match e {
            PageError::Short(_) => Reason::ShortPage,
            PageError::BadMagic(_) => Reason::NotEbs,
            PageError::BadHistogram { .. } => Reason::BadPage,
        }
    }
}

/// The collector's own duration histogram (per-bucket counts, not cumulative).
#[derive(Clone, Debug, Default)]
pub struct Durations {
    pub counts: [u64; DURATION_BUCKETS.len()],
    pub sum: f64,
    pub count: u64,
}

impl Durations {
    fn observe(&mut self, seconds: f64) {
        if let Some(slot) = DURATION_BUCKETS.iter().position(|b| seconds <= *b) {
            self.counts[slot] += 1;
        }
        self.sum += seconds;
        self.count += 1;
    }
}

/// One scrape's worth, for `render`.
#[derive(Clone, Debug, Default)]
pub struct EbsScrape {
    /// The node's instance id; empty while the identity is still being looked up.
    pub instance_id: String,
    /// `(volume id, statistics)`, sorted by volume id.
    pub volumes: Vec<(String, EbsStats)>,
    pub scrapes: u64,
    pub errors: u64,
    pub errors_by_reason: Vec<(Reason, u64)>,
    pub duration: Durations,
}

#[derive(Default)]
struct State {
    scrapes: u64,
    errors: u64,
    by_reason: BTreeMap<Reason, u64>,
    duration: Durations,
    last: Option<(Instant, Vec<(String, EbsStats)>)>,
    /// The last failure reason per volume, so a lasting failure is logged once.
    failing: HashMap<String, Reason>,
}

pub struct EbsStatsSource {
    config: EbsStatsConfig,
    reader: Arc<dyn PageReader>,
    node: Arc<NodeInfoSource>,
    in_flight: InFlight,
    /// Held for a whole scrape: concurrent scrapes take turns instead of racing for devices.
    state: Mutex<State>,
}

struct Failure {
    volume: Option<String>,
    reason: Reason,
    detail: String,
}

impl EbsStatsSource {
    pub fn new(
        config: EbsStatsConfig,
        reader: Arc<dyn PageReader>,
        node: Arc<NodeInfoSource>,
    ) -> Self {
        EbsStatsSource {
            config,
            reader,
            node,
            in_flight: InFlight::default(),
            state: Mutex::new(State::default()),
        }
    }

    /// Reads stuck in the kernel past their deadline right now.
    pub fn reads_in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Reads every wanted volume's page (blocking, bounded by the configured budget).
    pub fn scrape(&self, store: &Store) -> EbsScrape {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let started = Instant::now();
        state.scrapes += 1;
        let volumes = match &state.last {
            Some((at, v)) if at.elapsed() < self.config.min_interval => v.clone(),
            _ => {
                let mut failures = Vec::new();
                let v = self.collect(store, &mut failures);
                record_failures(&mut state, failures, &v);
                state.last = Some((Instant::now(), v.clone()));
                v
            }
        };
        state.duration.observe(started.elapsed().as_secs_f64());
        EbsScrape {
            instance_id: self.node.get().map(|i| i.node_id).unwrap_or_default(),
            volumes,
            scrapes: state.scrapes,
            errors: state.errors,
            errors_by_reason: Reason::ALL
                .iter()
                .map(|r| (*r, state.by_reason.get(r).copied().unwrap_or(0)))
                .collect(),
            duration: state.duration.clone(),
        }
    }

    fn collect(&self, store: &Store, failures: &mut Vec<Failure>) -> Vec<(String, EbsStats)> {
        let listing = |detail: String| Failure {
            volume: None,
            reason: Reason::Listing,
            detail,
        };
        let wanted = match wanted_volumes(store, self.config.mount_point_prefix.as_deref()) {
            Ok(w) if w.is_empty() => return Vec::new(),
            Ok(w) => w,
            Err(e) => {
                failures.push(listing(format!("reading the state file: {e}")));
                return Vec::new();
            }
        };
        let serials: HashSet<&str> = wanted.iter().map(|w| w.serial.as_str()).collect();
        let disks = match volumes::disks_by_serial(&self.config.sys_root, &serials) {
            Ok(d) => d,
            Err(e) => {
                let root = self.config.sys_root.display();
                failures.push(listing(format!("listing {root}/block: {e}")));
                return Vec::new();
            }
        };
        let mut to_read: Vec<(String, PathBuf)> = Vec::new();
        for w in &wanted {
            let mut fail = |reason, detail| {
                failures.push(Failure {
                    volume: Some(w.volume_id.clone()),
                    reason,
                    detail,
                })
            };
            match disks.get(&w.serial).map(Vec::as_slice).unwrap_or_default() {
                [] => fail(
                    Reason::NoDevice,
                    format!("no NVMe disk has serial {}", w.serial),
                ),
                [d] if d.model.as_deref() != Some(self.config.model.as_str()) => fail(
                    Reason::NotEbs,
                    format!(
                        "{} (serial {}) has model {:?}, not {:?}",
                        d.name,
                        w.serial,
                        d.model.as_deref().unwrap_or(""),
                        self.config.model
                    ),
                ),
                [d] => to_read.push((w.volume_id.clone(), self.config.dev_root.join(&d.name))),
                several => fail(
                    Reason::NoDevice,
                    format!(
                        "{} disks have serial {}: {}",
                        several.len(),
                        w.serial,
                        several
                            .iter()
                            .map(|d| d.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ),
            }
        }
        let devices: Vec<PathBuf> = to_read.iter().map(|(_, d)| d.clone()).collect();
        let outcomes = read_all(&self.reader, &self.in_flight, &devices, self.config.limits);
        let mut out = Vec::new();
        for ((volume, device), outcome) in to_read.into_iter().zip(outcomes) {
            let dev = device.display();
            let (reason, detail) = match outcome {
                Outcome::Page(page) => match ebs_page::parse(&page) {
                    Ok(stats) => {
                        out.push((volume, stats));
                        continue;
                    }
                    Err(e) => (Reason::of_page(&e), format!("{dev}: {e}")),
                },
                Outcome::Failed(e) => (Reason::of_read(&e), format!("{dev}: {e}")),
                Outcome::TimedOut => (
                    Reason::Timeout,
                    format!("{dev}: no answer within {:?}", self.config.limits.per_read),
                ),
                Outcome::Busy => (
                    Reason::Busy,
                    format!("{dev}: an earlier read is still waiting for the controller"),
                ),
                Outcome::NoThread(e) => (Reason::Io, format!("starting a reader thread: {e}")),
            };
            failures.push(Failure {
                volume: Some(volume),
                reason,
                detail,
            });
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}

fn record_failures(state: &mut State, failures: Vec<Failure>, read: &[(String, EbsStats)]) {
    for (volume, _) in read {
        if state.failing.remove(volume).is_some() {
            tracing::info!(volume = %volume, "EBS statistics: the volume's page is readable again");
        }
    }
    for f in failures {
        state.errors += 1;
        *state.by_reason.entry(f.reason).or_default() += 1;
        let volume = f.volume.as_deref().unwrap_or("-");
        let repeated = f
            .volume
            .as_ref()
            .is_some_and(|v| state.failing.insert(v.clone(), f.reason) == Some(f.reason));
        if repeated {
            tracing::debug!(volume, reason = f.reason.as_str(), detail = %f.detail, "EBS statistics unavailable");
        } else {
            tracing::warn!(volume, reason = f.reason.as_str(), detail = %f.detail,
                "EBS statistics unavailable; counted in aws_ebs_csi_nvme_collector_errors_total (logged again when the reason changes)");
        }
    }
}

/// The collector `serve` runs: the ebs backend serving the node service reads the NVMe pages;
/// other setups export none of this.
pub fn from_serve_args(
    args: &crate::cli::ServeArgs,
    node: &Arc<NodeInfoSource>,
) -> Option<EbsStatsSource> {
    if args.backend != crate::settings::BackendKind::Ebs || !args.mode.serves_node() {
        return None;
    }
    let mut config = EbsStatsConfig::new(
        args.sysfs_root.clone(),
        args.dev_root.clone(),
        args.ebs_model.clone(),
    );
    config.mount_point_prefix = args.csi_mount_point_prefix.clone();
    let reader = Arc::new(NvmeReader {
        ioctl_timeout: IOCTL_TIMEOUT,
    });
    Some(EbsStatsSource::new(config, reader, Arc::clone(node)))
}

#[cfg(test)]
mod tests;
