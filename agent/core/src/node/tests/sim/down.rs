//! What a user or root does on the host while the agent is down, between a crash and the
//! restart: a bind of a volume's device node in a place of its own, a mount of a volume at its
//! staging path by hand.

use super::Sim;
use super::actions::Action;
use crate::ledger::Ledger;
use crate::probe::ProbeOutcome;
use crate::records::Progress;

impl Sim {
    /// `dies_during`, with a user's bind of the call's volume's device made while the agent is
    /// down (`Action::BoundWhileDown`). A stage the agent never answered OK may be completed by
    /// start-up only once it has asked what else uses the device.
    pub(super) fn dies_bound(&mut self, call: &Action) {
        self.run_to_crash(call);
        let (Action::Call { id, .. } | Action::Inspect { id, .. }) = call else {
            return self.crash();
        };
        let bind = self.user_bind(id);
        let staged = |sim: &Self| {
            crate::ledger::Ledger::staged(&*sim.h.ledger, id)
                .ok()
                .flatten()
        };
        let before = staged(self);
        self.crash();
        if let Some((devnum, _)) = &bind
            && let Some(s) = staged(self)
            && before.is_some_and(|b| b.progress == crate::records::Progress::InProgress)
            && s.progress == crate::records::Progress::Complete
            && s.devnum.map(crate::DevNum::from) == Some(*devnum)
            && matches!(s.access, crate::records::AccessRecord::Mount { .. })
        {
            self.fail(format!(
                "start-up completed {id}'s stage while a user binds its device"
            ));
        }
        self.converge();
        if let Some((_, at)) = bind {
            self.h.host.state().mounts.remove(&at);
        }
    }

    /// A user's bind of `id`'s device node, unless the orchestrator believes `id` staged or
    /// published, or another id's records name the device's bytes (a bind made after a stage
    /// answered OK refuses its idempotent retries, as it should, and the orchestrator's retries
    /// are held to succeed).
    fn user_bind(&mut self, id: &str) -> Option<(crate::DevNum, std::path::PathBuf)> {
        let believed = self.belief.staged.contains_key(id)
            || self.belief.published.keys().any(|(v, _)| v == id);
        let device = self.h.backend.device_of(id);
        let others: Vec<crate::DevNum> = (self.h.ledger.all_staged().into_iter())
            .filter(|st| st.volume_id != id)
            .filter_map(|st| st.devnum.map(crate::DevNum::from))
            .collect();
        let mut s = self.h.host.state();
        let devnum = s.devices.get(&device).copied()?;
        let family = s.same_bytes(devnum);
        if believed || others.iter().any(|d| family.contains(d)) {
            return None;
        }
        let mut bind =
            crate::double::host::mount_facts(crate::DevNum::new(0, 5), "devtmpfs", false);
        bind.node.kind = crate::seam::FileKind::BlockDevice;
        bind.node.rdev = devnum;
        let at = self.h.dir.join("user-bind");
        s.mounts.insert(at.clone(), vec![bind]);
        Some((devnum, at))
    }

    /// `dies_during`, with root's own mount of the call's volume at its staging path made while
    /// the agent is down, without `nodev` (`Action::MountedWhileDown`).
    pub(super) fn dies_mounted(&mut self, call: &Action) {
        self.run_to_crash(call);
        if let Action::Call { id, .. } | Action::Inspect { id, .. } = call {
            self.mount_by_hand(id);
        }
        self.crash();
        self.converge();
    }

    /// Root mounts `id`'s filesystem at its staging path, or remounts the stage's own mount
    /// there, without `nodev`: only while no complete stage of `id` vouches for the place (root
    /// may remount anything; what the agent adopts is what it answers for), and never a device
    /// whose bytes another id's records name.
    fn mount_by_hand(&mut self, id: &str) {
        let staged = Ledger::staged(&*self.h.ledger, id).ok().flatten();
        if staged.is_some_and(|s| s.progress == Progress::Complete) {
            return;
        }
        let device = self.h.backend.device_of(id);
        let staging = self.stage_cmd(id, false).staging.as_path().to_path_buf();
        let others: Vec<crate::DevNum> = (self.h.ledger.all_staged().into_iter())
            .filter(|st| st.volume_id != id)
            .filter_map(|st| st.devnum.map(crate::DevNum::from))
            .collect();
        let mut s = self.h.host.state();
        let Some(devnum) = s.devices.get(&device).copied() else {
            return;
        };
        let family = s.same_bytes(devnum);
        if others.iter().any(|d| family.contains(d)) {
            return;
        }
        let Some(ProbeOutcome::Found(sig)) = s.probes.get(&devnum).cloned() else {
            return;
        };
        match s.mounts.get(&staging).and_then(|m| m.last()) {
            Some(top) if top.dev == devnum => {}
            Some(_) => return,
            None => {
                let by_hand = crate::double::host::mount_facts(devnum, &sig.type_name, false);
                s.mounts.entry(staging.clone()).or_default().push(by_hand);
                s.claimed.insert(devnum);
            }
        }
        s.dev_allowed.insert(staging);
    }
}
