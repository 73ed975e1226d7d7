//! What the simulated orchestrator, workloads and faults do: one `Action` a step, drawn from the
//! seed (swarm testing: each seed weighs the kinds of action its own way, and some seeds drive
//! only a few ids, so rare interleavings of a few doors come up often), and applied to the
//! simulated node. A run's actions are its history: replayed alone they give the same run,
//! which is how a failure is shrunk to a short reproduction (`replay`).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::AtomicI64;

use super::inspect::INSPECTIONS;
use super::{Crash, CrashAt, Sim};

/// The node calls the orchestrator makes.
pub const CALLS: [&str; 4] = ["stage", "publish", "unpublish", "unstage"];

/// One step. `flag`: raw block for a stage, read-only for a publish, attach for the controller.
#[derive(Clone, Debug)]
pub enum Action {
    Call {
        op: &'static str,
        id: String,
        target: &'static str,
        flag: bool,
    },
    /// A workload writes to what it was given; `over_start`: over the primary superblock.
    Write { id: String, over_start: bool },
    /// The loop controller attaches (`attach`) or detaches the volume's device.
    Controller { id: String, attach: bool },
    /// NodeExpandVolume, NodeGetVolumeStats or NodeReclaimSpace (`op`) by `id` at `at`'s place
    /// (`target`: "staging", "p1" or "p2"); `at` is another id a third of the time.
    Inspect {
        op: &'static str,
        id: String,
        at: String,
        target: &'static str,
    },
    /// ControllerExpandVolume grows the volume's disk.
    Grow { id: String },
    /// The call dies at its `at`-th journaled step; the agent restarts; the orchestrator retries.
    Crash { at: i64, call: Box<Action> },
    /// The call dies right after its `at`-th change to the host (mkfs, mount, bind, unmount,
    /// grow), before it records it; the agent restarts; the orchestrator retries.
    CrashMidStep { at: u32, call: Box<Action> },
    /// As `CrashMidStep`, and while the agent is down a user binds the call's volume's device
    /// node in a place of its own (in a namespace of its own, during e2fsck: a fifty-sixth fresh
    /// review's F1); the bind goes once the orchestrator's retries are made.
    BoundWhileDown { at: u32, call: Box<Action> },
    /// As `CrashMidStep`, and while the agent is down root mounts the call's volume by hand at
    /// its staging path without `nodev`, or remounts the cut stage's own mount so: what start-up
    /// or the retry adopts is made `nodev` first (a sixty-third fresh review's F1).
    MountedWhileDown { at: u32, call: Box<Action> },
    /// Mounts, read-only devices and claims gone, a new boot; the orchestrator retries.
    PowerCut,
    /// `first` waits inside the agent at its `at`-th journaled step while `second` runs.
    Concurrent {
        at: i64,
        first: Box<Action>,
        second: Box<Action>,
    },
    /// `recover --reset` (or a lost state file): the agent restarts on an empty ledger, the host
    /// as it was; the orchestrator goes on believing what it did.
    Reset,
    /// The host call `what` fails once, during `call`.
    Fail {
        what: &'static str,
        call: Box<Action>,
    },
}

/// The host calls a fault makes fail.
const FAULTS: [&str; 9] = [
    "mount", "bind", "unmount", "mkfs", "fsck", "lay", "grow", "syncfs", "fitrim",
];

/// The kinds of action, with the weights the first seeds of every run use.
const KINDS: [(&str, usize); 13] = [
    ("stage", 22),
    ("publish", 18),
    ("unpublish", 14),
    ("unstage", 12),
    ("write", 12),
    ("controller", 6),
    ("crash", 8),
    ("power-cut", 3),
    ("fail", 5),
    ("inspect", 10),
    ("grow", 3),
    ("reset", 1),
    ("concurrent", 8),
];

/// A seed's own weights and ids: seeds divisible by 4 keep the defaults and every id; the
/// others leave out about a third of the kinds and weigh the rest anew, and half of those drive
/// two or three ids only.
pub fn swarm(sim: &mut Sim) {
    if sim.seed.is_multiple_of(4) {
        sim.weights = KINDS.iter().map(|(_, w)| *w).collect();
        return;
    }
    sim.weights = KINDS
        .iter()
        .map(|(kind, w)| {
            let always = matches!(*kind, "stage" | "publish");
            if !always && sim.rng.below(3) == 0 {
                0
            } else {
                1 + sim.rng.below(w * 2)
            }
        })
        .collect();
    if sim.rng.below(2) == 0 {
        let keep = 2 + sim.rng.below(2);
        while sim.ids.len() > keep {
            let drop = sim.rng.below(sim.ids.len());
            sim.ids.remove(drop);
        }
    }
}

impl Sim {
    pub(super) fn draw(&mut self) -> Action {
        let id = self.rng.pick(&self.ids).clone();
        let target = *self.rng.pick(&["p1", "p2"]);
        let flag = self.rng.below(4) == 0;
        let total: usize = self.weights.iter().sum();
        let mut roll = self.rng.below(total);
        let mut kind = KINDS[0].0;
        for ((k, _), w) in KINDS.iter().zip(&self.weights) {
            if roll < *w {
                kind = k;
                break;
            }
            roll -= w;
        }
        let ids = self.ids.clone();
        let inspect = |rng: &mut super::Rng| Action::Inspect {
            op: INSPECTIONS[rng.below(INSPECTIONS.len())],
            id: id.clone(),
            at: if rng.below(3) == 0 {
                rng.pick(&ids).clone()
            } else {
                id.clone()
            },
            target: ["staging", "p1", "p2"][rng.below(3)],
        };
        let call = |rng: &mut super::Rng| {
            if rng.below(5) == 0 {
                inspect(rng)
            } else {
                Action::Call {
                    op: CALLS[rng.below(CALLS.len())],
                    id: id.clone(),
                    target,
                    flag,
                }
            }
        };
        match kind {
            "write" => Action::Write {
                id,
                over_start: self.rng.below(2) == 0,
            },
            "controller" => Action::Controller { id, attach: flag },
            "inspect" => inspect(&mut self.rng),
            "grow" => Action::Grow { id },
            "power-cut" => Action::PowerCut,
            "reset" => Action::Reset,
            "concurrent" => {
                // Most calls journal only a few steps: the first waits early most of the time,
                // and is a stage (the longest) half the time.
                let first = Action::Call {
                    op: if self.rng.below(2) == 0 {
                        "stage"
                    } else {
                        CALLS[self.rng.below(CALLS.len())]
                    },
                    id,
                    target,
                    flag,
                };
                let other = self.rng.pick(&self.ids).clone();
                let (op, target) = (
                    CALLS[self.rng.below(CALLS.len())],
                    *self.rng.pick(&["p1", "p2"]),
                );
                Action::Concurrent {
                    at: i64::try_from(if self.rng.below(4) == 0 {
                        self.rng.below(11) + 1
                    } else {
                        self.rng.below(3) + 1
                    })
                    .unwrap_or(1),
                    first: Box::new(first),
                    second: Box::new(Action::Call {
                        op,
                        id: other,
                        target,
                        flag: self.rng.below(4) == 0,
                    }),
                }
            }
            "crash" if self.rng.below(8) == 0 => Action::BoundWhileDown {
                at: u32::try_from(self.rng.below(3) + 1).unwrap_or(1),
                call: Box::new(call(&mut self.rng)),
            },
            "crash" if self.rng.below(7) == 0 => Action::MountedWhileDown {
                at: u32::try_from(self.rng.below(3) + 1).unwrap_or(1),
                call: Box::new(call(&mut self.rng)),
            },
            "crash" if self.rng.below(2) == 0 => Action::CrashMidStep {
                at: u32::try_from(self.rng.below(3) + 1).unwrap_or(1),
                call: Box::new(call(&mut self.rng)),
            },
            "crash" => Action::Crash {
                // A stage reaches eleven kill points (resolve, verify, probe, format and mount,
                // each an intent and a done, then staged): every one of them, and one past.
                at: i64::try_from(self.rng.below(12) + 1).unwrap_or(1),
                call: Box::new(call(&mut self.rng)),
            },
            "fail" => Action::Fail {
                what: FAULTS[self.rng.below(FAULTS.len())],
                call: Box::new(call(&mut self.rng)),
            },
            op => Action::Call {
                op: CALLS.iter().find(|c| **c == op).copied().unwrap_or("stage"),
                id,
                target,
                flag,
            },
        }
    }

    /// Applies one action and checks every rule after it.
    pub(super) fn apply(&mut self, action: &Action) {
        self.history.push(action.clone());
        let owners_before = self.mount_owners();
        let mounts_before = self.h.host.state().mounts.keys().cloned().collect();
        let calls_before = self.h.host.state().calls.len();
        let (id, kind) = match action {
            Action::Call { id, op, .. } | Action::Inspect { id, op, .. } => (id.as_str(), *op),
            Action::Grow { id } => (id.as_str(), "grow"),
            Action::Write { id, .. } => (id.as_str(), "write"),
            Action::Controller { id, .. } => (id.as_str(), "controller"),
            Action::Crash { call, .. }
            | Action::CrashMidStep { call, .. }
            | Action::BoundWhileDown { call, .. }
            | Action::MountedWhileDown { call, .. }
            | Action::Fail { call, .. } => match &**call {
                Action::Call { id, .. } | Action::Inspect { id, .. } => (id.as_str(), "fault"),
                _ => ("", "fault"),
            },
            Action::PowerCut => ("", "power-cut"),
            Action::Reset => ("", "reset"),
            Action::Concurrent { first, .. } => match &**first {
                Action::Call { id, .. } => (id.as_str(), "concurrent"),
                _ => ("", "concurrent"),
            },
        };
        let id = id.to_string();
        match action {
            Action::Call { .. } | Action::Inspect { .. } => {
                let _ = self.call_action(action);
            }
            Action::Grow { id } => self.grow(id),
            Action::Write { id, over_start } => self.write(id, *over_start),
            Action::Controller { id, attach } if !id.starts_with("local-") => {
                self.controller(*attach, id)
            }
            Action::Controller { .. } => {}
            Action::PowerCut => {
                self.power_cut();
                self.converge();
            }
            Action::Reset => self.reset(),
            Action::Concurrent { at, first, second } => self.concurrently(*at, first, second),
            Action::Fail { what, call } => {
                self.h.host.fail(what, "simulated failure");
                let _ = self.call_action(call);
                self.h.host.state().fail.clear();
            }
            Action::Crash { at, call } => {
                self.h.restart(Arc::new(CrashAt(AtomicI64::new(*at))));
                self.boot_log_fails_at(u32::try_from(*at).unwrap_or(0));
                self.dies_during(call);
            }
            Action::CrashMidStep { at, call } => {
                self.h.host.state().crash_after_acts = Some(*at);
                self.boot_log_fails_at(*at);
                self.dies_during(call);
            }
            Action::BoundWhileDown { at, call } => {
                self.h.host.state().crash_after_acts = Some(*at);
                self.dies_bound(call);
            }
            Action::MountedWhileDown { at, call } => {
                self.h.host.state().crash_after_acts = Some(*at);
                self.dies_mounted(call);
            }
        }
        // A mount either of two calls at once took away was taken by its owner's own call.
        let second = match action {
            Action::Concurrent { second, .. } => match &**second {
                Action::Call { id, .. } => id.clone(),
                _ => id.clone(),
            },
            _ => id.clone(),
        };
        self.check(
            &[&id, &second],
            kind,
            &owners_before,
            &mounts_before,
            calls_before,
        );
    }

    /// A third of the crashes (by their kill point, so a replay draws the same) come after the
    /// store's boot log failed an append (a full state disk): the crash then loses every lazy
    /// write since the last durable one, and `Boot` writes were made durable.
    fn boot_log_fails_at(&self, at: u32) {
        if at.is_multiple_of(3) {
            self.h.ledger.stop_boot_log();
        }
    }

    /// Runs `call` until the crash set up for it (or to its end), then the agent restarts and
    /// the orchestrator retries what it believes.
    fn dies_during(&mut self, call: &Action) {
        self.run_to_crash(call);
        self.crash();
        self.converge();
    }

    /// Runs `call` until the crash set up for it (or to its end); any other panic goes on.
    pub(super) fn run_to_crash(&mut self, call: &Action) {
        let result = catch_unwind(AssertUnwindSafe(|| self.call_action(call)));
        self.h.host.state().crash_after_acts = None;
        if let Err(payload) = result
            && payload.downcast_ref::<Crash>().is_none()
        {
            std::panic::resume_unwind(payload);
        }
    }

    pub(super) fn call_action(&mut self, action: &Action) -> crate::error::Result<()> {
        match action {
            Action::Call {
                op,
                id,
                target,
                flag,
            } => self.call(op, id, target, *flag),
            Action::Inspect { op, id, at, target } => self.inspect(op, id, at, target),
            _ => Ok(()),
        }
    }
}
