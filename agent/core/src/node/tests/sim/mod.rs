//! A seeded simulation of the node (issue 51, its first part: the doors the core holds). A
//! random orchestrator drives stage, raw block stage, publish (read-write and read-only),
//! unpublish and unstage by three volumes and two node-local handles naming their devices, the
//! loop controller's attach and detach, workloads writing to what they were given, scripted host
//! failures, agent crashes at any journaled step (a panic at the step's kill point: everything in
//! memory lost, the lazy writes with it) and power cuts (mounts, read-only devices and the
//! non-durable writes gone, a new boot). After every call it checks, against what the
//! orchestrator believes:
//!
//! 1. mkfs never runs on a device a workload wrote to;
//! 2. no device has two owners, and no call takes away a mount another id's records placed;
//! 3. a read-only publication is never writable;
//! 4. after a crash or a power cut, the orchestrator's retries of what it believes (every stage,
//!    then every publication) all succeed, and the records then say what it believes.
//!
//! One seed replays one run exactly; a violation names the seed and the calls that led to it.
//! `EBS_SIM_SEEDS` sets how many seeds run (and `EBS_SIM_FIRST_SEED` the first), so a long run
//! is `EBS_SIM_SEEDS=100000 cargo test -p ebs-node-core --release sim`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

mod checks;

use super::devices::serial;
use super::double::GIB;
use super::rng::Rng;
use super::*;
use crate::DevNum;
use crate::ledger::Ledger;
use crate::node::Observer;
use crate::records::{AccessRecord, ClaimDoor, DeviceClaim, Durability, claim_key};
use crate::request::AccessMode;
use crate::steps::{Op, Step};

/// The payload of a simulated crash.
struct Crash;

/// Crashes the agent at the `n`-th journal kill point it reaches.
struct CrashAt(AtomicI64);

impl Observer for CrashAt {
    fn reached(&self, _op: Op, _step: Step, _phase: crate::records::Phase) {
        if self.0.fetch_sub(1, Ordering::Relaxed) == 1 {
            std::panic::panic_any(Crash);
        }
    }
}

/// Simulated crashes print nothing; every other panic as before.
fn quiet_crashes() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let before = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if info.payload().downcast_ref::<Crash>().is_none() {
                before(info);
            }
        }));
    });
}

/// What the orchestrator believes: what succeeded and was not undone since.
#[derive(Default, Clone, Debug)]
struct Belief {
    /// id -> raw block staging?
    staged: BTreeMap<String, bool>,
    /// (id, target name) -> read-only?
    published: BTreeMap<(String, String), bool>,
}

const VOLUMES: [&str; 3] = ["vol-a", "vol-b", "vol-c"];

/// The directory name standing for an id in paths.
fn dir_of(id: &str) -> String {
    id.rsplit('-').next().map_or_else(
        || "x".into(),
        |last| {
            if id.starts_with("local-") {
                format!("h{last}")
            } else {
                last.to_string()
            }
        },
    )
}

struct Sim {
    h: Harness,
    seed: u64,
    rng: Rng,
    ids: Vec<String>,
    belief: Belief,
    /// Devices a workload wrote to, with who wrote.
    written: HashMap<DevNum, String>,
    history: Vec<String>,
    calls: u64,
}

impl Sim {
    fn new(seed: u64) -> Sim {
        let h = Harness::new();
        for v in VOLUMES {
            h.host.add_device(&format!("dev-{v}"), GIB);
        }
        let ids = VOLUMES
            .iter()
            .map(|v| v.to_string())
            .chain([handle("vol-a"), handle("vol-b")])
            .collect();
        Sim {
            h,
            seed,
            rng: Rng::new(seed),
            ids,
            belief: Belief::default(),
            written: HashMap::new(),
            history: Vec::new(),
            calls: 0,
        }
    }

    fn fail(&self, what: String) -> ! {
        panic!(
            "simulation seed {}: {what}\nafter these calls:\n{}",
            self.seed,
            self.history.join("\n")
        )
    }

    fn mode(id: &str) -> AccessMode {
        if id.starts_with("local-") {
            AccessMode::MultiNodeMultiWriter
        } else {
            AccessMode::SingleNodeWriter
        }
    }

    fn stage_cmd(&self, id: &str, block_access: bool) -> StageCommand {
        let mut cmd = self.h.stage_cmd(VOL, mount(AccessMode::SingleNodeWriter));
        cmd.volume = VolumeId::parse(id).expect("id");
        cmd.staging = self
            .h
            .path("staging_target_path", &format!("staging/{}", dir_of(id)));
        // One handle acts for the volume whose device it names (upstream's node-local volumes),
        // the other does not.
        if id == handle("vol-a") {
            cmd.publish_context
                .insert("volumeID".into(), "vol-a".into());
        }
        cmd.capability = if block_access {
            block(Self::mode(id))
        } else {
            mount(Self::mode(id))
        };
        cmd
    }

    fn publish_cmd(&self, id: &str, target: &str, readonly: bool) -> PublishCommand {
        let block_access = self.belief.staged.get(id).copied().unwrap_or_else(|| {
            self.h
                .ledger
                .staged(id)
                .ok()
                .flatten()
                .is_some_and(|s| matches!(s.access, AccessRecord::Block))
        });
        let stage = self.stage_cmd(id, block_access);
        PublishCommand {
            volume: stage.volume,
            staging: stage.staging,
            target: self.h.target(&format!("{}-{target}", dir_of(id))),
            capability: stage.capability,
            readonly,
        }
    }

    /// One call of the orchestrator's, by `id`; updates the belief on success.
    fn call(&mut self, op: &str, id: &str, target: &str, flag: bool) -> Result<()> {
        self.calls += 1;
        let ctx = Arc::clone(&self.h.ctx);
        let vid = VolumeId::parse(id).expect("id");
        let r = match op {
            "stage" => crate::node::stage(&ctx, &self.stage_cmd(id, flag)),
            "publish" => crate::node::publish(&ctx, &self.publish_cmd(id, target, flag)),
            "unpublish" => crate::node::unpublish(
                &ctx,
                &UnpublishCommand {
                    volume: vid,
                    target: self.h.target(&format!("{}-{target}", dir_of(id))),
                },
            ),
            "unstage" => {
                let staging = self.stage_cmd(id, false).staging;
                crate::node::unstage(
                    &ctx,
                    &UnstageCommand {
                        volume: vid,
                        staging,
                    },
                )
            }
            _ => Ok(()),
        };
        if r.is_ok() {
            match op {
                "stage" => {
                    // A second stage with another access type is refused, so the first stays.
                    self.belief.staged.entry(id.to_string()).or_insert(flag);
                }
                "publish" => {
                    self.belief
                        .published
                        .entry((id.to_string(), target.to_string()))
                        .or_insert(flag);
                }
                "unpublish" => {
                    self.belief
                        .published
                        .remove(&(id.to_string(), target.to_string()));
                }
                "unstage" => {
                    self.belief.staged.remove(id);
                }
                _ => {}
            }
        }
        r
    }

    /// The loop controller's attach or detach of a volume: its claim comes and goes with the
    /// attachment; a detach is refused while the node holds the device (the daemon's `in_use`).
    fn controller(&mut self, attach: bool, id: &str) {
        let key = claim_key(ClaimDoor::Controller, &serial(id), None).expect("key");
        let claim = DeviceClaim {
            volume_id: id.to_string(),
            door: ClaimDoor::Controller,
            identity: serial(id),
            at_unix_ms: 0,
            acts_for: None,
        };
        let held = crate::node::device_claim::node_owner(&*self.h.ledger, &serial(id), None)
            .unwrap_or_else(|e| self.fail(format!("reading a claim: {e}")));
        let may = crate::node::device_claim::controller_may_take(&*self.h.ledger, id, &serial(id));
        let ledger = &self.h.ledger;
        let _ = if attach && may.is_ok() {
            ledger.write(
                Durability::Immediate,
                Box::new(|w| w.put_claim(&key, &claim)),
            )
        } else if held.is_none() {
            ledger.write(Durability::Immediate, Box::new(|w| w.delete_claim(&key)))
        } else {
            Ok(())
        };
    }

    /// A workload writes to what it was given: a raw block publication's bytes, or a file in a
    /// mounted one (the device then holds data, whoever's claim is on it).
    fn write(&mut self, id: &str) {
        let Some(((_, target), _)) = self
            .belief
            .published
            .iter()
            .find(|((v, _), ro)| v == id && !**ro)
            .map(|(k, v)| (k.clone(), *v))
        else {
            return;
        };
        let path = self
            .h
            .target(&format!("{}-{target}", dir_of(id)))
            .as_path()
            .to_path_buf();
        let mut s = self.h.host.state();
        let Some(top) = s.mounts.get(&path).and_then(|m| m.last()).cloned() else {
            return;
        };
        if top.read_only {
            drop(s);
            self.fail(format!(
                "{id}'s read-write publication at {} is read-only",
                path.display()
            ));
        }
        let dev = if top.node.kind == crate::seam::FileKind::BlockDevice {
            top.node.rdev
        } else {
            top.dev
        };
        if top.node.kind == crate::seam::FileKind::BlockDevice {
            s.not_blank.insert(dev);
        }
        drop(s);
        self.written.entry(dev).or_insert_with(|| id.to_string());
    }

    /// The agent dies: what is in memory is gone, the lazy writes with it; the host stays.
    fn crash(&mut self) {
        self.h.ledger.power_cut();
        self.h.restart(Arc::new(super::super::Unobserved));
    }

    /// The power goes: mounts, read-only devices and claims on devices go too; a new boot.
    fn power_cut(&mut self) {
        {
            let mut s = self.h.host.state();
            s.mounts.clear();
            s.claimed.clear();
            s.read_only.clear();
            s.boot += 1;
        }
        self.crash();
    }

    /// After a crash or a power cut: the orchestrator's retries of what it believes converge.
    fn converge(&mut self) {
        let belief = self.belief.clone();
        for (id, block_access) in &belief.staged {
            if let Err(e) = self.call("stage", id, "", *block_access) {
                self.fail(format!("the retried stage of {id} failed: {e}"));
            }
        }
        for ((id, target), ro) in &belief.published {
            if let Err(e) = self.call("publish", id, target, *ro) {
                self.fail(format!(
                    "the retried publish of {id} at {target} failed: {e}"
                ));
            }
        }
        for id in belief.staged.keys() {
            if !matches!(self.h.ledger.staged(id), Ok(Some(_))) {
                self.fail(format!("{id} is believed staged but has no record"));
            }
        }
    }

    fn step(&mut self) {
        let id = self.rng.pick(&self.ids).clone();
        let target = (*self.rng.pick(&["p1", "p2"])).to_string();
        let roll = self.rng.below(100);
        let flag = self.rng.below(4) == 0;
        let op = match roll {
            0..=21 => "stage",
            22..=39 => "publish",
            40..=53 => "unpublish",
            54..=65 => "unstage",
            66..=77 => "write",
            78..=83 => "controller",
            84..=91 => "crash",
            92..=94 => "power-cut",
            _ => "fail",
        };
        self.history.push(format!(
            "{op} {id} {target} {}",
            if flag { "+" } else { "" }
        ));
        let owners_before = self.mount_owners();
        let mounts_before: BTreeSet<_> = self.h.host.state().mounts.keys().cloned().collect();
        let calls_before = self.h.host.state().calls.len();
        match op {
            "write" => self.write(&id),
            "controller" if !id.starts_with("local-") => self.controller(flag, &id),
            "controller" => {}
            "power-cut" => {
                self.power_cut();
                self.converge();
            }
            "fail" => {
                let what = *self
                    .rng
                    .pick(&["mount", "bind", "unmount", "mkfs", "fsck", "lay"]);
                self.h.host.fail(what, "simulated failure");
                let op = *self.rng.pick(&["stage", "publish", "unpublish", "unstage"]);
                let _ = self.call(op, &id, &target, flag);
                self.h.host.state().fail.clear();
            }
            "crash" => {
                // The next call dies at its n-th journaled step.
                let n = i64::try_from(self.rng.below(6) + 1).unwrap_or(1);
                self.h.restart(Arc::new(CrashAt(AtomicI64::new(n))));
                let op = *self.rng.pick(&["stage", "publish", "unpublish", "unstage"]);
                let result = catch_unwind(AssertUnwindSafe(|| self.call(op, &id, &target, flag)));
                if let Err(payload) = result
                    && payload.downcast_ref::<Crash>().is_none()
                {
                    std::panic::resume_unwind(payload);
                }
                self.crash();
                self.converge();
            }
            op => {
                let _ = self.call(op, &id, &target, flag);
            }
        }
        self.check(&id, op, &owners_before, &mounts_before, calls_before);
    }
}

/// Seeds run in one test binary's run, and the calls they made (all tests of the binary add).
static CALLS: AtomicU64 = AtomicU64::new(0);

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// Runs `seeds` seeds from `first`, `steps` steps each, on every core: seed `first + k` runs on
/// thread `k % threads`, so one seed still replays alone (`EBS_SIM_FIRST_SEED`, `EBS_SIM_SEEDS=1`).
fn run_seeds(first: u64, seeds: u64, steps: u64) -> u64 {
    let threads = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let every = u64::try_from(threads).unwrap_or(1);
    std::thread::scope(|scope| {
        let runners: Vec<_> = (0..every.min(seeds.max(1)))
            .map(|t| {
                scope.spawn(move || {
                    let mut calls = 0;
                    for seed in (first + t..first + seeds).step_by(threads) {
                        let mut sim = Sim::new(seed);
                        for _ in 0..steps {
                            sim.step();
                        }
                        calls += sim.calls;
                    }
                    calls
                })
            })
            .collect();
        runners
            .into_iter()
            .map(|r| r.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .sum()
    })
}

#[test]
fn the_simulated_node_keeps_every_never_do_rule() {
    quiet_crashes();
    let first = env_u64("EBS_SIM_FIRST_SEED", 1);
    let seeds = env_u64("EBS_SIM_SEEDS", 3600);
    let steps = env_u64("EBS_SIM_STEPS", 240);
    let started = std::time::Instant::now();
    let calls = run_seeds(first, seeds, steps);
    CALLS.fetch_add(calls, Ordering::Relaxed);
    println!(
        "simulation: seeds {first}..{}, {steps} steps each, {} calls, 0 violations, {:.1} s",
        first + seeds,
        CALLS.load(Ordering::Relaxed),
        started.elapsed().as_secs_f64()
    );
}
