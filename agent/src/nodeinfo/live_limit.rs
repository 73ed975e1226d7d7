//! The attach limit as of now: NodeGetInfo recomputes it on every call from sysfs and the state
//! file (kubelet re-reads it with MutableCSINodeAllocatableCount), never from instance metadata.
//! Interfaces the VPC CNI attaches later and disks attached outside the agent are seen as they
//! come and go. Reading a few sysfs attributes costs microseconds and cannot block on I/O.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use super::attach_limit::{self, Derivation, LimitInputs};
use super::host_devices;

/// The NVMe serials (normalized) of the volumes the agent has staged: their slots are the
/// scheduler's to count, so they are not reserved.
#[derive(Clone)]
pub struct StagedSerials(Arc<dyn Fn() -> HashSet<String> + Send + Sync>);

impl StagedSerials {
    pub fn fixed(serials: HashSet<String>) -> Self {
        StagedSerials(Arc::new(move || serials.clone()))
    }

    /// Read from the state file at each call. A read error counts no volume as staged, which
    /// can only lower the limit.
    pub fn from_store(store: Arc<ebs_store::Store>) -> Self {
        StagedSerials(Arc::new(move || match store.all_staged() {
            Ok(staged) => staged
                .into_iter()
                .filter_map(|s| match s.identity {
                    ebs_store::DeviceIdentity::NvmeSerial { serial } => {
                        Some(host_devices::normalize_serial(&serial))
                    }
                    _ => None,
                })
                .collect(),
            Err(e) => {
                tracing::warn!(error = %e, "attach limit: cannot read staged volumes");
                HashSet::new()
            }
        }))
    }

    pub fn get(&self) -> HashSet<String> {
        (self.0)()
    }
}

impl Default for StagedSerials {
    fn default() -> Self {
        StagedSerials::fixed(HashSet::new())
    }
}

impl std::fmt::Debug for StagedSerials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StagedSerials")
    }
}

/// What the limit depends on that is known once (flags, the instance type) plus where to look
/// for what changes.
#[derive(Debug)]
pub struct LiveLimit {
    /// Everything but the interfaces and the unmanaged volumes, which are counted per call.
    pub fixed: LimitInputs,
    /// The interface count instance metadata gave at start: used when sysfs shows none.
    pub imds_interfaces: Option<u32>,
    pub sysfs_root: PathBuf,
    pub staged: StagedSerials,
    last: AtomicI64,
}

impl LiveLimit {
    pub fn new(
        fixed: LimitInputs,
        imds_interfaces: Option<u32>,
        sysfs_root: PathBuf,
        staged: StagedSerials,
    ) -> Self {
        LiveLimit {
            fixed,
            imds_interfaces,
            sysfs_root,
            staged,
            last: AtomicI64::new(i64::MIN),
        }
    }

    /// Counts what is attached now and applies the formula.
    pub fn derive(&self) -> Derivation {
        let mut inputs = self.fixed.clone();
        if inputs.override_limit.is_none() {
            let pci = host_devices::network_interfaces(&self.sysfs_root);
            inputs.network_interfaces = if pci > 0 {
                Some((pci, "PCI devices bound to ena/ixgbevf"))
            } else {
                self.imds_interfaces
                    .map(|n| (n, "instance metadata at start"))
            };
            let disks = host_devices::attached_disks(&self.sysfs_root);
            inputs.unmanaged_ebs = disks.not_staged(&self.staged.get());
        }
        attach_limit::compute(&inputs)
    }

    /// The limit now; logged when it differs from the last answer.
    pub fn current(&self) -> i64 {
        let d = self.derive();
        if self.last.swap(d.limit, Ordering::Relaxed) != d.limit {
            tracing::info!(max_volumes_per_node = d.limit, how = %d.how, "attach limit");
        }
        d.limit
    }
}
