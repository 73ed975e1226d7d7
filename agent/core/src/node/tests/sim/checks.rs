//! The simulation's checks after every call: the never-do rules (see the module's comment).

use std::collections::{BTreeSet, HashMap};

use super::Sim;
use crate::DevNum;

impl Sim {
    /// Which id's records placed each mount.
    pub(super) fn mount_owners(&self) -> HashMap<std::path::PathBuf, String> {
        let mut owners = HashMap::new();
        for s in self.h.ledger.all_staged() {
            owners.insert(s.staging_path, s.volume_id);
        }
        for p in self.h.ledger.all_publications() {
            owners.insert(p.target_path, p.volume_id);
        }
        owners
    }

    pub(super) fn check(
        &self,
        ids: &[&str],
        op: &str,
        owners_before: &HashMap<std::path::PathBuf, String>,
        mounts_before: &BTreeSet<std::path::PathBuf>,
        calls_before: usize,
    ) {
        let s = self.h.host.state();
        // 1. mkfs never over a device a workload wrote to.
        for call in s.calls.iter().skip(calls_before) {
            if let Some(name) = call
                .what
                .strip_prefix("mkfs ")
                .and_then(|r| r.split(' ').nth(1))
            {
                let path = self.h.dir.join("dev").join(name);
                let devices = s.devices.get(&path).map(|d| s.same_bytes(*d));
                if let Some(writer) = devices.iter().flatten().find_map(|d| self.written.get(d)) {
                    let what = format!("mkfs ran over {name}, which {writer}'s workload wrote");
                    drop(s);
                    self.fail(what);
                }
            }
        }
        // 2. No device has two owners.
        let mut holders: HashMap<String, BTreeSet<String>> = HashMap::new();
        for staged in self.h.ledger.all_staged() {
            holders
                .entry(format!("{:?}", staged.identity))
                .or_default()
                .insert(staged.volume_id.clone());
            // ... nor its bytes, under whatever device they are shown.
            if let Some(d) = staged.devnum {
                let d = s.bottom(DevNum::from(d));
                holders
                    .entry(format!("the bytes of {d}"))
                    .or_default()
                    .insert(staged.volume_id);
            }
        }
        if let Some((device, owners)) = holders.iter().find(|(_, o)| o.len() > 1) {
            let what = format!("{device} has owners {owners:?}");
            drop(s);
            self.fail(what);
        }
        // ... and no call took away a mount another id's records placed (a power cut takes all).
        if op != "power-cut" {
            let after: BTreeSet<_> = s.mounts.keys().cloned().collect();
            for gone in mounts_before.difference(&after) {
                if let Some(owner) = owners_before.get(gone)
                    && !ids.contains(&owner.as_str())
                {
                    let what = format!("{ids:?} took away {owner}'s mount at {}", gone.display());
                    drop(s);
                    self.fail(what);
                }
            }
        }
        // ... nor took away a read-only device a bind still shows (records or none: after a
        // state reset no record names it, and the workload's device would read empty).
        for (at, stack) in &s.mounts {
            let gone = stack.iter().find(|m| {
                m.node.kind == crate::seam::FileKind::BlockDevice
                    && s.ro_tags.contains_key(&m.node.rdev)
                    && !s.read_only.iter().any(|(ro, _)| *ro == m.node.rdev)
            });
            if let Some(m) = gone {
                let what = format!(
                    "the read-only device {} bound at {} was detached under it",
                    m.node.rdev,
                    at.display()
                );
                drop(s);
                self.fail(what);
            }
        }
        // 3. A read-only publication is never writable.
        for p in self.h.ledger.all_publications() {
            if !p.readonly || p.progress != crate::records::Progress::Complete {
                continue;
            }
            if let Some(top) = s.mounts.get(&p.target_path).and_then(|m| m.last()) {
                let ro_device = top.node.kind == crate::seam::FileKind::BlockDevice
                    && s.read_only.iter().any(|(ro, _)| *ro == top.node.rdev);
                if !top.read_only && !ro_device {
                    let what = format!(
                        "{}'s read-only publication at {} is writable",
                        p.volume_id,
                        p.target_path.display()
                    );
                    drop(s);
                    self.fail(what);
                }
            }
        }
        // ... and a filesystem publication the agent vouches for lets no device node open (a
        // staging found `dev`, the upstream plugin's or root's, is taken: only root reaches it,
        // and every publication is bound `nodev` whatever the staging has).
        let published = (self.h.ledger.all_publications().into_iter())
            .filter(|p| !p.block && p.progress == crate::records::Progress::Complete)
            .map(|p| (p.volume_id, p.target_path));
        if let Some((id, at)) = published
            .into_iter()
            .find(|(_, at)| s.dev_allowed.contains(at))
        {
            let what = format!("{id}'s mount at {} lets device nodes open", at.display());
            drop(s);
            self.fail(what);
        }
    }
}
