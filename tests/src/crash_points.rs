//! Crash points for `--crash-after op.step.phase`, built from the names the agent's journal
//! writes (`ebs_node_core::steps`): a renamed or removed step fails to compile here instead of
//! leaving a point the agent never reaches (the agent refuses an unknown point at start too).

pub use ebs_node_core::steps::{Op, Step};

/// Right after the step's intent is committed.
pub fn intent(op: Op, step: Step) -> String {
    format!("{op}.{step}.intent")
}

/// Right after the step's done line is committed (or held, for a lazy one).
pub fn done(op: Op, step: Step) -> String {
    format!("{op}.{step}.done")
}
