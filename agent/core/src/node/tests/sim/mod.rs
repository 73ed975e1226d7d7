//! A seeded simulation of the node (issue 51, its first part: the doors the core holds). A
//! random orchestrator drives stage, raw block stage, publish (read-write and read-only),
//! unpublish and unstage by three volumes and two node-local handles naming their devices, the
//! loop controller's attach and detach, workloads writing to what they were given, scripted host
//! failures, agent crashes at any journaled step (a panic at the step's kill point: everything in
//! memory lost, the lazy writes with it), power cuts (mounts, read-only devices and the
//! non-durable writes gone, a new boot) and state resets (`recover --reset`: the ledger empty,
//! the host as it was), and two calls at once (`concurrent`: the first waits inside the agent at
//! one of its journaled steps while the second runs), and what users and root do while a crashed
//! agent is down (`down`: a bind of a volume's device node, a volume mounted by hand at its
//! staging path without `nodev`). After every call it checks, against what the orchestrator
//! believes:
//!
//! 1. mkfs never runs on a device a workload wrote to;
//! 2. no device has two owners, no call takes away a mount another id's records placed, and no
//!    read-only device a bind shows is detached;
//! 3. a read-only publication is never writable, and no filesystem staging or publication the
//!    records vouch for lets a device node open (it is `nodev`);
//! 4. after a crash or a power cut, the orchestrator's retries of what it believes (every stage,
//!    then every publication) all succeed, and the records then say what it believes.
//!
//! One seed replays one run exactly; a violation names the seed and the calls that led to it.
//! `EBS_SIM_SEEDS` sets how many seeds run (and `EBS_SIM_FIRST_SEED` the first), so a long run
//! is `EBS_SIM_SEEDS=100000 cargo test -p ebs-node-core --release sim`. Without it, 36 seeds
//! (about ten thousand calls, under a second), so the core's unit tests stay fast; the test
//! command (tests/run.sh) runs 3,600, a million calls.

use std::collections::{BTreeMap, HashMap};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

mod actions;
mod calls;
mod checks;
mod concurrent;
mod down;
mod events;
mod inspect;
mod replay;

use super::rng::Rng;
use super::*;
use crate::DevNum;
use crate::double::host::GIB;
use crate::double::mounts::Crash;
use crate::ledger::Ledger;
use crate::node::Observer;
use crate::records::AccessRecord;
use crate::request::AccessMode;
use crate::steps::{Op, Step};

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
            if info.payload().downcast_ref::<Crash>().is_none()
                && !replay::SHRINKING.load(Ordering::Relaxed)
            {
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
    /// Ids whose unstage answered OK, and publications whose unpublish did, with no call of
    /// theirs since: a crash must not bring their records back.
    released: std::collections::BTreeSet<(String, String)>,
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
    history: Vec<actions::Action>,
    calls: u64,
    /// This seed's weight for each kind of action (`actions::swarm`).
    weights: Vec<usize>,
    /// The observer every agent start gets (`concurrent`).
    parker: Arc<concurrent::Parker>,
    /// A state reset happened (`events::reset`): the agent's answers to retries of what it
    /// no longer records are not held to the belief.
    reset_seen: bool,
}

impl Sim {
    fn new(seed: u64) -> Sim {
        let mut h = Harness::new();
        let parker = Arc::new(concurrent::Parker::default());
        h.restart(Arc::clone(&parker) as _);
        for v in VOLUMES {
            h.host.add_device(&format!("dev-{v}"), GIB);
        }
        // An operator's loop device laid over vol-c's disk, identity-less (a loop device over a
        // block device has no serial): vol-c's bytes under another number. A node-local handle
        // names it (issue 49's stacked devices, from the simulation's side).
        let stack = h.host.add_device("dev-stack", GIB);
        let (stack, under) = (h.host.devnum(&stack), h.backend.device_of("vol-c"));
        let under = h.host.devnum(&under);
        {
            let mut s = h.host.state();
            s.lies_on
                .insert(stack, vec![crate::node::host::Under::Device(under)]);
            s.unverified.insert(stack);
        }
        let ids = VOLUMES
            .iter()
            .map(|v| v.to_string())
            .chain([handle("vol-a"), handle("vol-b"), handle("stack")])
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
            weights: Vec::new(),
            reset_seen: false,
            parker,
        }
    }

    fn fail(&self, what: String) -> ! {
        panic!(
            "simulation seed {}: {what}\nafter these actions:\n{:#?}",
            self.seed, self.history
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

    fn step(&mut self) {
        let action = self.draw();
        self.apply(&action);
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

/// One seed's run; a violation panics with the seed, the message and the run shrunk to a short
/// reproduction (`replay::shrink`).
fn run_seed(seed: u64, steps: u64) -> u64 {
    let mut sim = Sim::new(seed);
    actions::swarm(&mut sim);
    let run = catch_unwind(AssertUnwindSafe(|| {
        for _ in 0..steps {
            sim.step();
        }
    }));
    if let Err(payload) = run {
        let what = payload
            .downcast_ref::<String>()
            .cloned()
            .unwrap_or_else(|| "a panic".into());
        let first_line = what.lines().next().unwrap_or_default().to_string();
        let shrunk = replay::shrink(sim.history.clone(), &what);
        panic!(
            "{first_line}\nshrunk from {} to {} actions (replay them with `replay::replay`):\n{shrunk:#?}",
            sim.history.len(),
            shrunk.len()
        );
    }
    sim.calls
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
                        calls += run_seed(seed, steps);
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
    let seeds = env_u64("EBS_SIM_SEEDS", 36);
    let steps = env_u64("EBS_SIM_STEPS", 240);
    let started = std::time::Instant::now();
    let calls = run_seeds(first, seeds, steps);
    CALLS.fetch_add(calls, Ordering::Relaxed);
    let line = format!(
        "simulation: seeds {first}..{}, {steps} steps each, {} calls, 0 violations, {:.1} s",
        first + seeds,
        CALLS.load(Ordering::Relaxed),
        started.elapsed().as_secs_f64()
    );
    println!("{line}");
    // The test command prints it after the run (a passing test's output is captured).
    if let Some(report) = std::env::var_os("EBS_SIM_REPORT") {
        use std::io::Write;
        let _ = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(report)
            .and_then(|mut f| writeln!(f, "{line}"));
    }
}
