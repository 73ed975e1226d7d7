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

/// The shortest list found whose replay still breaks a rule (one action left out at a time,
/// from the last, while the violation stays).
pub fn shrink(actions: Vec<Action>) -> Vec<Action> {
    SHRINKING.store(true, Ordering::Relaxed);
    let mut kept = actions;
    let mut i = kept.len();
    while i > 0 {
        i -= 1;
        let mut trial = kept.clone();
        trial.remove(i);
        if replay(&trial).is_err() {
            kept = trial;
        }
    }
    SHRINKING.store(false, Ordering::Relaxed);
    kept
}
