//! A failing run, replayed and shrunk: its actions are applied again to a fresh node, and each
//! one whose removal keeps a violation is left out, until none can be. What is left is the
//! reproduction a failure prints, ready to paste into a regression test (`replay` of it).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};

use super::Sim;
use super::actions::Action;

/// Set while shrinking: the panics of the trial runs print nothing.
pub static SHRINKING: AtomicBool = AtomicBool::new(false);

/// Applies `actions` to a fresh node; the violation's message when one breaks a rule.
pub fn replay(actions: &[Action]) -> Result<(), String> {
    let mut sim = Sim::new(0);
    let run = catch_unwind(AssertUnwindSafe(|| {
        for a in actions {
            sim.apply(a);
        }
    }));
    run.map_err(|payload| {
        payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_string()))
            .unwrap_or_else(|| "a panic".into())
    })
}

/// What a violation is, without its seed: the first words of its message.
fn kind(message: &str) -> String {
    let line = message.lines().next().unwrap_or_default();
    let rest = line.split_once(": ").map_or(line, |(_, r)| r);
    rest.split_whitespace()
        .take(4)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The shortest list found whose replay still breaks the same rule as `violation` (one action
/// left out at a time, from the last, while that violation stays).
pub fn shrink(actions: Vec<Action>, violation: &str) -> Vec<Action> {
    SHRINKING.store(true, Ordering::Relaxed);
    let wanted = kind(violation);
    let mut kept = actions;
    let mut i = kept.len();
    while i > 0 {
        i -= 1;
        let mut trial = kept.clone();
        trial.remove(i);
        if replay(&trial).is_err_and(|m| kind(&m) == wanted) {
            kept = trial;
        }
    }
    SHRINKING.store(false, Ordering::Relaxed);
    kept
}

/// Runs that once broke a rule, shrunk, kept as regressions: each must replay clean.
#[test]
fn shrunk_reproductions_stay_fixed() {
    super::quiet_crashes();
    let call = |op: &'static str, id: &str, flag: bool| Action::Call {
        op,
        id: id.to_string(),
        target: "p1",
        flag,
    };
    let handle_b = "local-ebs://dev/dev-vol-b";
    let stack = "local-ebs://dev/dev-stack";
    let at = |target: &'static str, call: Action| match call {
        Action::Call { op, id, flag, .. } => Action::Call {
            op,
            id,
            target,
            flag,
        },
        other => other,
    };
    let handle_a = "local-ebs://dev/dev-vol-a";
    let handle_b_call = |op: &'static str, flag: bool| call(op, handle_b, flag);
    let runs: [(&str, Vec<Action>); 23] = [
        (
            // Seed 30066061, once a filesystem unstage's release was `Boot` (the boot log, not an
            // fsync): a power cut after the OK brought back the stage as the last durable commit
            // had it, in progress, and start-up kept it for a retry.
            "an acknowledged unstage, then a power cut",
            vec![
                at("p2", call("unpublish", "vol-a", true)),
                at("p2", call("stage", "vol-a", false)),
                Action::Fail {
                    what: "bind",
                    call: Box::new(at("p2", call("publish", "vol-a", false))),
                },
                call("unstage", "vol-a", false),
                call("stage", "vol-a", false),
                call("unstage", "vol-a", false),
                Action::PowerCut,
            ],
        ),
        (
            // Two owners: a handle staged the device a volume had staged raw (the node claim's
            // refusal off: seed 1, shrunk from 17 actions).
            "a handle on a staged volume's device",
            vec![call("stage", "vol-b", true), call("stage", handle_b, false)],
        ),
        (
            // Seed 6 of the first simulation: the controller's attach after a handle's stage
            // locked the handle out of its own retry.
            "the controller's attach after a handle's stage",
            vec![
                call("stage", handle_b, false),
                Action::Controller {
                    id: "vol-b".into(),
                    attach: true,
                },
                Action::Crash {
                    at: 1,
                    call: Box::new(call("unpublish", "vol-c", false)),
                },
            ],
        ),
        (
            // Seed 20, once the simulation laid a loop device over vol-c's disk: a publish
            // killed at its intent left the handle's claim alive after its unstage, vol-c staged
            // the bytes under it, and the handle's retake skipped the stack walk: two owners.
            "a handle's retake over bytes another volume staged since",
            vec![
                call("stage", stack, false),
                Action::Crash {
                    at: 1,
                    call: Box::new(at("p2", call("publish", stack, false))),
                },
                call("unstage", stack, false),
                call("stage", "vol-c", false),
                call("stage", stack, true),
            ],
        ),
        (
            // Seed 4, with the retake's walk asking the controller's claim too: an attach after
            // the handle's stage locked the handle out of its own retry.
            "the controller's attach under a handle's stacked device",
            vec![
                call("stage", stack, false),
                Action::Controller {
                    id: "vol-c".into(),
                    attach: true,
                },
                Action::Crash {
                    at: 3,
                    call: Box::new(call("stage", "vol-a", true)),
                },
            ],
        ),
        (
            // Seed 2, once restarts ran start-up recovery: a power cut took a block
            // publication's bind, recovery dropped its record, and the retried publish refused
            // the file the agent had made at the target ("the agent did not create it").
            "a block publication retried after a power cut",
            vec![
                call("stage", "vol-b", true),
                call("publish", "vol-b", false),
                Action::PowerCut,
            ],
        ),
        (
            // Seed 16: once restarts ran start-up recovery, a handle's stage on the stacked
            // device, then the controller's attach of vol-c, then a power cut: the attach had
            // been let through over bytes the handle held (the model now asks the bytes, as the
            // real controller's identity check does), and the handle's retry was refused.
            "the controller's attach over bytes a handle holds through a stacked device",
            vec![
                call("stage", stack, false),
                Action::Controller {
                    id: "vol-c".into(),
                    attach: true,
                },
                Action::PowerCut,
            ],
        ),
        (
            // Seed 2, once the simulation checked that releases stay released (the 24th fresh
            // review's F2): a raw block stage killed before its answer, its unstage answered OK
            // with a lazy record, and any crash after brought the staging back for good.
            "an acknowledged unstage of a raw block staging, then a crash",
            vec![
                Action::Crash {
                    at: 5,
                    call: Box::new(call("stage", handle_a, true)),
                },
                call("unstage", handle_a, false),
                Action::Crash {
                    at: 2,
                    call: Box::new(call("publish", "vol-b", true)),
                },
            ],
        ),
        (
            // Seed 2 again, with the unstage durable: a block publish killed at its intent, its
            // unpublish answered OK (lazily), and recovery then kept the returned record as an
            // interrupted publish although its file was gone.
            "an acknowledged unpublish of an interrupted block publish, then a crash",
            vec![
                Action::Crash {
                    at: 5,
                    call: Box::new(call("stage", handle_a, true)),
                },
                Action::Crash {
                    at: 1,
                    call: Box::new(call("publish", handle_a, false)),
                },
                Action::Crash {
                    at: 6,
                    call: Box::new(call("unpublish", handle_a, false)),
                },
            ],
        ),
        (
            // Seed 2044463 of the long run: a stage whose mount failed (its clean-up lazy), the
            // unstage answered OK, a crash: start-up recovery kept the failed stage's durable
            // intent "for the retry", and the device stayed held.
            "a failed stage, its unstage, then a crash",
            vec![
                Action::Fail {
                    what: "mount",
                    call: Box::new(at("p2", call("stage", handle_b, false))),
                },
                Action::Crash {
                    at: 4,
                    call: Box::new(at("p2", call("unstage", handle_b, false))),
                },
            ],
        ),
        (
            // The format intent's hold (issue 49's second finding), reached once crashes fell
            // between a host change and its record: vol-b's mkfs ran, the agent died before its
            // done record; a handle took the device raw and its workload wrote; then vol-b's
            // redo formatted over those bytes. With `holds_through_node`'s intent clause off:
            // "mkfs ran over dev-vol-b, which local-ebs://dev/dev-vol-b's workload wrote".
            "a format intent surviving raw use under another id",
            vec![
                Action::CrashMidStep {
                    at: 1,
                    call: Box::new(call("stage", "vol-b", false)),
                },
                handle_b_call("stage", true),
                handle_b_call("publish", false),
                Action::Write {
                    id: handle_b.into(),
                    over_start: false,
                },
                handle_b_call("unpublish", false),
                handle_b_call("unstage", false),
                call("stage", "vol-b", false),
            ],
        ),
        (
            // Seed 5008132 of the long run, once crashes fell mid-step: the handle's stage on the
            // stacked device died after its mkfs (its format intent holding the device, no staged
            // record), and the model of the controller let vol-c's attach through, the bytes under
            // the handle's device (the real controller sees such a holder by identity): the
            // handle's retry was refused. The model asks the node claims too now.
            "the controller's attach under a handle's interrupted stage on a stacked device",
            vec![
                Action::CrashMidStep {
                    at: 1,
                    call: Box::new(call("stage", stack, false)),
                },
                Action::Controller {
                    id: "vol-c".into(),
                    attach: true,
                },
                Action::CrashMidStep {
                    at: 1,
                    call: Box::new(at("p2", call("unstage", "vol-c", false))),
                },
                Action::CrashMidStep {
                    at: 3,
                    call: Box::new(at("p2", call("stage", stack, true))),
                },
            ],
        ),
        (
            // Issue 49's third medium, found by the simulation once it reset the state (seed 15
            // of its first run with the sweep's use check off; seed 46 shrunk to six actions,
            // this is their core): after `recover --reset` no record names a live read-only
            // block publication's device, and start-up's sweep detached it under the bind.
            "the read-only device under a live publication after a state reset",
            vec![
                call("stage", stack, true),
                at("p2", call("publish", stack, true)),
                Action::Reset,
            ],
        ),
        (
            // Two calls at once (the simulation's first concurrent runs, with the device locks
            // keyed per volume, that is off: seed 546 of 1,000, "NvmeSerial { serial: \"vol-b\" }
            // has owners {local-ebs://dev/dev-vol-b, vol-b}"): vol-b's stage waits after its
            // device is verified and taken, its claim not yet written; the handle naming that
            // device stages meanwhile.
            "two ids staging one device at once",
            vec![Action::Concurrent {
                at: 5,
                first: Box::new(call("stage", "vol-b", false)),
                second: Box::new(call("stage", handle_b, false)),
            }],
        ),
        (
            // ... and the other way round, the handle first, caught at its verified device.
            "a handle and the volume its device is, staging at once",
            vec![Action::Concurrent {
                at: 4,
                first: Box::new(call("stage", handle_b, true)),
                second: Box::new(call("stage", "vol-b", true)),
            }],
        ),
        (
            // Seed 682 of the first concurrent runs, a hole in the double: vol-c's raw stage
            // waits with its device's other views held (the real host opens them O_EXCL; the
            // double's hold was a no-op), and the stacked device's handle staged over vol-c's
            // bytes: "the bytes of 259:3 has owners {local-ebs://dev/dev-stack, vol-c}". The
            // double's holds claim the views now, as O_EXCL does.
            "a stacked device staged while the volume under it holds its views",
            vec![
                call("unstage", "vol-c", false),
                Action::Concurrent {
                    at: 4,
                    first: Box::new(call("stage", "vol-c", true)),
                    second: Box::new(at("p2", call("stage", stack, true))),
                },
            ],
        ),
        (
            // The long run's seed 8007346 (a hole in the double): after a reset no record said
            // vol-b's raw block publication was live, and a handle naming vol-b's device formatted
            // it under that publication (its workload's bytes then overwritten by the redo of the
            // interrupted mkfs). The daemon's node-local backend refuses a device the host shows
            // in raw use on a handle's first stage; the double's backend does too now.
            "a handle on a device a live raw publication binds, after a reset",
            vec![
                call("stage", "vol-b", true),
                at("p2", call("publish", "vol-b", false)),
                Action::Reset,
                Action::CrashMidStep {
                    at: 1,
                    call: Box::new(call("stage", handle_b, false)),
                },
                Action::Write {
                    id: "vol-b".into(),
                    over_start: false,
                },
                Action::Crash {
                    at: 12,
                    call: Box::new(call("stage", handle_b, false)),
                },
            ],
        ),
        (
            // Found once the double refused raw use: a raw block staging of a device with no
            // identity to prove (the stacked device; on a host, a disk without a serial) was
            // dropped by every restart's recovery ("the staging mount is gone"), and the retried
            // stage was then refused by its own publication's bind. Recovery keeps it while the
            // attachment it was staged on is at its numbers (`StagedVolume::attachment`).
            "an unverified raw block staging across a restart",
            vec![
                call("stage", stack, true),
                Action::Crash {
                    at: 4,
                    call: Box::new(call("publish", stack, false)),
                },
            ],
        ),
        (
            // The long run's seed 9044383 (and 9036274, 9007xxx), once the double's backend
            // refused raw use for handles only: after a reset, vol-b's own stage took the device
            // a handle had published raw (the raw-use check lived in the node-local backend, so
            // no other door asked it). The core asks it on every first take now.
            "a volume staged on its device a handle publishes raw, after a reset",
            vec![
                at("p2", call("stage", handle_b, true)),
                at("p2", call("publish", handle_b, false)),
                Action::Reset,
                call("stage", "vol-b", true),
                Action::Inspect {
                    op: "stats",
                    id: "vol-b".into(),
                    at: handle_b.into(),
                    target: "p2",
                },
            ],
        ),
        (
            // The long run's seed 10116203 on the final core, shrunk from 139 actions: a failed
            // raw publish and a failed filesystem stage each dropped their record lazily; the
            // unstage after them found no record and answered OK without a durable write, and a
            // crash brought the stage's record back (held by the publication's intent).
            "an unstage answered with no record in view, then a crash",
            vec![
                Action::Concurrent {
                    at: 3,
                    first: Box::new(call("stage", handle_a, true)),
                    second: Box::new(at("p2", call("stage", "vol-c", false))),
                },
                Action::Fail {
                    what: "lay",
                    call: Box::new(call("unpublish", handle_a, true)),
                },
                Action::Fail {
                    what: "bind",
                    call: Box::new(at("p2", call("publish", handle_a, false))),
                },
                call("unstage", handle_a, false),
                Action::Fail {
                    what: "mount",
                    call: Box::new(at("p2", call("stage", handle_a, false))),
                },
                Action::Crash {
                    at: 6,
                    call: Box::new(at("p2", call("unstage", handle_a, false))),
                },
            ],
        ),
        (
            // A fifty-sixth fresh review's F1, found by the simulation once a user could bind a
            // device while the agent was down (seed 440 of its first run, with recovery's
            // post-mount questions off): the stage died after its mount (mkfs, then mount),
            // before it asked what else uses the device, and start-up completed its record with
            // the user's bind there.
            "a stage cut after its mount, its device bound while the agent was down",
            vec![Action::BoundWhileDown {
                at: 2,
                call: Box::new(call("stage", "vol-a", false)),
            }],
        ),
        (
            // A sixty-third fresh review's F1, found by the simulation once root could mount a
            // volume by hand while the agent was down (seed 44 of its first run, with the
            // adopted mount's `restrict` a no-op; refused by `as_made` since): a stage died after mkfs, root mounted the
            // volume at its staging path without `nodev`, and start-up completed the stage over
            // that mount as it was; a stage that finds it mounted with no record is the same.
            "a stage cut after mkfs, its volume mounted by hand while the agent was down",
            vec![
                Action::MountedWhileDown {
                    at: 1,
                    call: Box::new(call("stage", "vol-a", false)),
                },
                Action::Reset,
                call("stage", "vol-a", false),
            ],
        ),
        (
            // Seed 14213 of a long run (the model's, not the agent's): after a reset the
            // orchestrator still believed a read-write publication at p1 that the agent no longer
            // knew; a read-only publish of p1 cut by a crash left its bind there, and a workload's
            // write through the believed publication met it. The agent is held only to the
            // publications it records after a reset.
            "a believed publication after a reset, a read-only one bound at its target",
            vec![
                Action::Concurrent {
                    at: 1,
                    first: Box::new(call("stage", handle_a, false)),
                    second: Box::new(at("p2", call("unstage", handle_a, true))),
                },
                Action::Crash {
                    at: 3,
                    call: Box::new(call("unpublish", handle_b, false)),
                },
                call("publish", handle_a, false),
                Action::Reset,
                Action::Crash {
                    at: 2,
                    call: Box::new(at("p2", call("unstage", handle_a, false))),
                },
                Action::PowerCut,
                Action::CrashMidStep {
                    at: 2,
                    call: Box::new(at("p2", call("unstage", handle_a, false))),
                },
                at("p2", call("stage", handle_a, false)),
                Action::CrashMidStep {
                    at: 1,
                    call: Box::new(call("publish", handle_a, true)),
                },
                Action::Write {
                    id: handle_a.into(),
                    over_start: true,
                },
            ],
        ),
    ];
    for (what, actions) in runs {
        if let Err(violation) = replay(&actions) {
            panic!("{what}: {violation}");
        }
    }
}
