//! Two calls at once, deterministically: the first runs on a thread of its own until its
//! `at`-th journaled step (the same points a crash may fall on), and waits there, inside the
//! agent, its locks and claims held, while the second runs to its end; then the first goes on.
//! Only one of them runs at any moment, so a seed still replays one run exactly. The agent's
//! per-volume and per-device locks are try-locks (a second call on a busy volume is refused,
//! never kept waiting), so the second call cannot wait on the first.

use std::sync::{Arc, Mutex, mpsc};
use std::thread::ThreadId;

use super::Sim;
use super::actions::Action;
use crate::node::Observer;
use crate::records::Phase;
use crate::steps::{Op, Step};

/// The simulation's observer: nothing, unless a thread is to wait at one of its steps.
#[derive(Default)]
pub(super) struct Parker {
    plan: Mutex<Option<Plan>>,
}

struct Plan {
    thread: ThreadId,
    left: i64,
    parked: mpsc::Sender<()>,
    resume: mpsc::Receiver<()>,
}

/// Disarms the parker when the first call ends, however it ends (the main thread then stops
/// waiting for it to park).
struct Armed<'a>(&'a Parker);

impl Drop for Armed<'_> {
    fn drop(&mut self) {
        crate::node::lock(&self.0.plan).take();
    }
}

impl Parker {
    fn arm(&self, at: i64, parked: mpsc::Sender<()>, resume: mpsc::Receiver<()>) -> Armed<'_> {
        *crate::node::lock(&self.plan) = Some(Plan {
            thread: std::thread::current().id(),
            left: at,
            parked,
            resume,
        });
        Armed(self)
    }
}

impl Observer for Parker {
    fn reached(&self, _op: Op, _step: Step, _phase: Phase) {
        let mut plan = crate::node::lock(&self.plan);
        let Some(p) = plan.as_mut() else { return };
        if p.thread != std::thread::current().id() {
            return;
        }
        p.left -= 1;
        if p.left > 0 {
            return;
        }
        let Some(p) = plan.take() else { return };
        drop(plan);
        let _ = p.parked.send(());
        let _ = p.resume.recv();
    }
}

impl Sim {
    /// `first` waits at its `at`-th step while `second` runs (see the module's comment).
    pub(super) fn concurrently(&mut self, at: i64, first: &Action, second: &Action) {
        let Action::Call {
            op,
            id,
            target,
            flag,
        } = first
        else {
            return;
        };
        let run = self.prepare(op, id, target, *flag);
        let ctx = Arc::clone(&self.h.ctx);
        let parker = Arc::clone(&self.parker);
        let (parked_tx, parked_rx) = mpsc::channel();
        let (resume_tx, resume_rx) = mpsc::channel();
        std::thread::scope(|scope| {
            // Owned here, so a panic of the second call drops it before the scope joins the
            // first, which then stops waiting (else the run would hang instead of failing).
            let resume_tx = resume_tx;
            let running = scope.spawn(move || {
                let _armed = parker.arm(at, parked_tx, resume_rx);
                run(&ctx)
            });
            // Parked, or ended without reaching its `at`-th step (its sender is gone): then it
            // answered before the second call began, and the orchestrator heard it first.
            let parked = parked_rx.recv().is_ok();
            if parked {
                let _ = self.call_action(second);
                let _ = resume_tx.send(());
            }
            let r = running
                .join()
                .unwrap_or_else(|p| std::panic::resume_unwind(p));
            self.believe(op, id, target, *flag, &r);
            if !parked {
                let _ = self.call_action(second);
            }
        });
    }
}
