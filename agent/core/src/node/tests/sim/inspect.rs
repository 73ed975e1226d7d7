//! The calls on a staged volume's place (NodeExpandVolume, NodeGetVolumeStats, NodeReclaimSpace),
//! asked by an id at its own place or, the hostile share, at another id's; the controller growing
//! a volume's device; and the start-up recovery a restart runs (every recorded volume checked
//! against the host, then the read-only devices no record names swept). Their rules: no call
//! grows or trims what another id holds, and no call answers for another id's place.

use super::{Sim, dir_of};
use crate::error::Result;
use crate::node::expand::{ExpandCommand, expand};
use crate::node::reclaim::{ReclaimCommand, ReclaimPath, reclaim};
use crate::node::stats::{StatsCommand, volume_stats};
use crate::request::{RequestPath, VolumeId};

/// The calls on a volume's place.
pub const INSPECTIONS: [&str; 3] = ["expand", "stats", "reclaim"];

/// What the controller grows a volume's device by.
const GROWTH: u64 = 1 << 29;

impl Sim {
    /// `at`'s staging path, or its publication target `target` ("p1", "p2").
    fn place(&self, at: &str, target: &str) -> RequestPath {
        if target == "staging" {
            self.stage_cmd(at, false).staging
        } else {
            self.h.target(&format!("{}-{target}", dir_of(at)))
        }
    }

    /// The name of the device `id` names (a volume's own disk, or the device a handle names).
    fn device_name(id: &str) -> String {
        match id.strip_prefix("local-ebs://dev/") {
            Some(name) => name.to_string(),
            None => format!("dev-{id}"),
        }
    }

    /// `op` by `id` at `at`'s place; checks that it grew, trimmed or answered for nothing but
    /// `id`'s own.
    pub(super) fn inspect(&mut self, op: &str, id: &str, at: &str, target: &str) -> Result<()> {
        self.calls += 1;
        let ctx = std::sync::Arc::clone(&self.h.ctx);
        let volume = VolumeId::parse(id).expect("id");
        let path = self.place(at, target);
        let staging = Some(self.stage_cmd(id, false).staging);
        let calls_before = self.h.host.state().calls.len();
        let r = match op {
            "expand" => expand(
                &ctx,
                &ExpandCommand {
                    volume,
                    volume_path: path,
                    staging,
                    required_bytes: 0,
                    limit_bytes: 0,
                    capability: None,
                },
            )
            .map(drop),
            "stats" => volume_stats(
                &ctx,
                &StatsCommand {
                    volume,
                    volume_path: path,
                    staging,
                },
            )
            .map(drop),
            _ => {
                let path = if target == "staging" {
                    ReclaimPath::Staging(path)
                } else {
                    ReclaimPath::Published(path)
                };
                reclaim(&ctx, &ReclaimCommand { volume, path }).map(drop)
            }
        };
        let own = Self::device_name(id);
        let done: Vec<String> = self.h.host.state().calls[calls_before..]
            .iter()
            .map(|c| c.what.clone())
            .collect();
        for what in done {
            let grown = what.strip_prefix("grow ").and_then(|r| r.split(' ').nth(1));
            if let Some(device) = grown
                && device != own
            {
                self.fail(format!("{op} by {id} at {at}'s place grew {device}"));
            }
            if at != id && what.starts_with("fitrim ") {
                self.fail(format!("{op} by {id} trimmed {at}'s filesystem"));
            }
        }
        if r.is_ok() && at != id {
            self.fail(format!("{op} by {id} answered for {at}'s {target} place"));
        }
        r
    }

    /// ControllerExpandVolume: the volume's disk grows (a handle names no volume to grow).
    pub(super) fn grow(&mut self, id: &str) {
        if id.starts_with("local-") {
            return;
        }
        let device = self.h.backend.device_of(id);
        let devnum = self.h.host.devnum(&device);
        let mut s = self.h.host.state();
        if let Some(bytes) = s.device_bytes.get_mut(&devnum) {
            *bytes += GROWTH;
        }
    }

    /// What the daemon does when it starts: every recorded volume checked against the host,
    /// then the read-only devices no record names swept. Neither may fail on a host no fault
    /// is scripted on.
    pub(super) fn start_up(&mut self) {
        use crate::ledger::Ledger;
        let ids = Ledger::recorded_volume_ids(&*self.h.ledger)
            .unwrap_or_else(|e| self.fail(format!("listing the recorded volumes: {e}")));
        for vol in ids {
            if let Err(e) = crate::node::recover::recover_volume(&self.h.ctx, &vol) {
                self.fail(format!("start-up recovery of {vol} failed: {e}"));
            }
        }
        if let Err(e) = crate::node::read_only::sweep(&self.h.ctx) {
            self.fail(format!(
                "the start-up sweep of read-only devices failed: {e}"
            ));
        }
    }
}
