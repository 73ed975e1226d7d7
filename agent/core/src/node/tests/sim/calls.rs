//! The orchestrator's node calls: each made from the belief (`prepare`, which needs the
//! simulation), run against the agent (which needs only its context, so a call may run on a
//! thread of its own: `concurrent`), and its answer taken into the belief (`believe`).

use std::sync::Arc;

use super::super::*;
use super::{Sim, dir_of};
use crate::ledger::Ledger;
use crate::node::NodeCtx;
use crate::records::AccessRecord;

/// A call ready to run against the agent.
pub(super) type Prepared = Box<dyn FnOnce(&NodeCtx) -> Result<()> + Send>;

impl Sim {
    /// One call of the orchestrator's, by `id`; updates the belief on success.
    pub(super) fn call(&mut self, op: &str, id: &str, target: &str, flag: bool) -> Result<()> {
        let run = self.prepare(op, id, target, flag);
        let ctx = Arc::clone(&self.h.ctx);
        let r = run(&ctx);
        self.believe(op, id, target, flag, &r);
        r
    }

    /// Counts the call, forgets a release it may undo, and builds its command.
    pub(super) fn prepare(&mut self, op: &str, id: &str, target: &str, flag: bool) -> Prepared {
        self.calls += 1;
        // Any call of the id's (at that target) since the release may record it again.
        self.belief
            .released
            .remove(&(id.to_string(), String::new()));
        self.belief
            .released
            .remove(&(id.to_string(), target.to_string()));
        let vid = VolumeId::parse(id).expect("id");
        let run: Prepared = match op {
            "stage" => {
                let cmd = self.stage_cmd(id, flag);
                Box::new(move |ctx| crate::node::stage(ctx, &cmd))
            }
            "publish" => {
                let cmd = self.publish_cmd(id, target, flag);
                Box::new(move |ctx| crate::node::publish(ctx, &cmd))
            }
            "unpublish" => {
                let cmd = UnpublishCommand {
                    volume: vid,
                    target: self.h.target(&format!("{}-{target}", dir_of(id))),
                };
                Box::new(move |ctx| crate::node::unpublish(ctx, &cmd))
            }
            "unstage" => {
                let cmd = UnstageCommand {
                    volume: vid,
                    staging: self.stage_cmd(id, false).staging,
                };
                Box::new(move |ctx| crate::node::unstage(ctx, &cmd))
            }
            _ => Box::new(|_| Ok(())),
        };
        // The daemon runs every call under the volume's guard (`run_locked`): a second call on
        // a volume in flight is refused, busy.
        let volume = id.to_string();
        Box::new(move |ctx| {
            let _guard = (ctx.locks.try_lock(&volume))
                .ok_or_else(|| crate::error::Error::Busy(volume.clone()))?;
            run(ctx)
        })
    }

    /// What the orchestrator learns from a call's answer.
    pub(super) fn believe(&mut self, op: &str, id: &str, target: &str, flag: bool, r: &Result<()>) {
        if r.is_err() {
            return;
        }
        match op {
            // A second stage with another access type, or a publish with another read-only
            // flag, is refused, so the first stays; unless a reset lost the records the
            // refusal rests on (the belief is then stale, and the answer tells the truth).
            "stage" if self.reset_seen => {
                self.belief.staged.insert(id.to_string(), flag);
            }
            "stage" => {
                self.belief.staged.entry(id.to_string()).or_insert(flag);
            }
            "publish" => {
                let at = (id.to_string(), target.to_string());
                if self.reset_seen {
                    self.belief.published.insert(at, flag);
                } else {
                    self.belief.published.entry(at).or_insert(flag);
                }
                // A publish succeeds only on a staged volume: a stage whose answer a crash
                // lost did happen, and kubelet, which publishes only what it staged, would
                // stage it again after a reboot.
                if !self.belief.staged.contains_key(id)
                    && let Ok(Some(staged)) = self.h.ledger.staged(id)
                {
                    let block = matches!(staged.access, AccessRecord::Block);
                    self.belief.staged.insert(id.to_string(), block);
                }
            }
            "unpublish" => {
                self.belief
                    .published
                    .remove(&(id.to_string(), target.to_string()));
                self.belief
                    .released
                    .insert((id.to_string(), target.to_string()));
            }
            "unstage" => {
                self.belief.staged.remove(id);
                self.belief.released.insert((id.to_string(), String::new()));
            }
            _ => {}
        }
    }
}
