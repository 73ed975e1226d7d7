//! The attach limit as of now: NodeGetInfo recomputes it on every call from sysfs and the state
//! file (kubelet re-reads it with MutableCSINodeAllocatableCount), never from instance metadata.
//! Interfaces the VPC CNI attaches later and disks attached outside the agent are seen as they
//! come and go. Reading a few sysfs attributes costs microseconds and cannot block on I/O.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use super::{csi_owned, host_devices};
use ebs_node_core::ec2::attach_limit::{self, Derivation, LimitInputs};
use ebs_node_core::ec2::ebs::normalize_serial;

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
                    ebs_node_core::records::DeviceIdentity::NvmeSerial { serial } => {
                        Some(normalize_serial(&serial))
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
    /// The CSI driver name whose kubelet paths prove a disk is a CSI volume (`csi_owned`).
    pub driver: String,
    last: AtomicI64,
    /// The disks last proven CSI-owned from the mount table, with the unknown disks they were
    /// proven among: the table is read again only when that set changes (a disk attached or
    /// detached), not at every NodeGetInfo (kubelet asks every 10 s).
    owned: Mutex<Option<(Vec<host_devices::Disk>, HashSet<String>)>>,
}

impl LiveLimit {
    pub fn new(
        fixed: LimitInputs,
        imds_interfaces: Option<u32>,
        sysfs_root: PathBuf,
        staged: StagedSerials,
        driver: String,
    ) -> Self {
        LiveLimit {
            fixed,
            imds_interfaces,
            sysfs_root,
            staged,
            driver,
            last: AtomicI64::new(i64::MIN),
            owned: Mutex::new(None),
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
            let staged = self.staged.get();
            let owned = self.csi_owned(disks.unknown(&staged).cloned().collect());
            inputs.unmanaged_ebs = disks.not_csi(&staged, &owned);
        }
        attach_limit::compute(&inputs)
    }

    /// Which of `unknown` (attached EBS disks the journal does not know) kubelet's mounts prove
    /// to be CSI volumes. A mount table that cannot be read proves nothing, which can only
    /// lower the limit.
    fn csi_owned(&self, unknown: Vec<host_devices::Disk>) -> HashSet<String> {
        if unknown.is_empty() {
            return HashSet::new();
        }
        let mut cached = self.owned.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((disks, owned)) = cached.as_ref()
            && *disks == unknown
        {
            return owned.clone();
        }
        let owned = match ebs_node_host::mount::at_path::read_table() {
            Ok(table) => csi_owned::csi_owned(&unknown, &table, &self.driver),
            Err(e) => {
                tracing::warn!(error = %e, "attach limit: cannot read the mount table");
                return HashSet::new();
            }
        };
        if !owned.is_empty() {
            tracing::info!(
                volumes = ?owned,
                "attach limit: attached volumes staged by kubelet for this driver before the \
                 agent ran are counted as CSI volumes, not reserved"
            );
        }
        *cached = Some((unknown, owned.clone()));
        owned
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
