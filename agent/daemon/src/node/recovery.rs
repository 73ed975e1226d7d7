//! Start-up recovery: reconcile the journal's records with the host, one volume at a time.
//! Every step whose effect the host shows is completed (a staging mount of the volume → the stage
//! is complete; a bind of it at a target → the publication is complete); records of mounts that a
//! reboot (or an operator) removed are dropped, so the next call redoes the work. Half-done steps
//! with nothing on the host are left for the retry, which resumes from the host's state (and is
//! never held to the failed call's arguments). One log line per volume says what was found.
//!
//! A volume whose records cannot be checked (a path refused, a dead mount, an I/O error, a record
//! that does not decode, a check that does not finish in time) is marked as needing attention
//! (`node::attention`) and nothing else: the agent gets ready and every other volume works.

use std::sync::Arc;
use std::time::Duration;

use ebs_node_core::node::{VolumeGuard, VolumeLocks};
use ebs_node_core::records::{Durability, FormatState};
use ebs_node_core::steps::Step;
use ebs_store::Store;

use super::AgentCtx;
use super::attention::{self, Checked};
use crate::error::blocking;
use ebs_node_core::error::Result;

/// How long start-up waits for one volume's check; a check still running then (a stat hanging
/// below a dead NFS or FUSE mount) leaves its volume marked, and start-up goes on.
pub const VOLUME_WAIT: Duration = Duration::from_secs(5);
/// Volumes checked at once at start-up: a hung check stops counting once its wait is over.
const PARALLEL: usize = 4;

#[derive(Debug, Default)]
pub struct RecoveryReport {
    pub volumes: usize,
    pub dropped_stagings: usize,
    pub dropped_publications: usize,
    pub completed: usize,
    pub needing_attention: usize,
    /// Volumes forgotten: only lines of calls that changed nothing named them.
    pub pruned: usize,
}

/// Start-up recovery of every volume with a record, each on its own blocking thread, waiting
/// `wait` at most for each. Fails only when the state file itself cannot be read.
pub async fn recover(ctx: &Arc<AgentCtx>, wait: Duration) -> Result<RecoveryReport> {
    let ids = {
        let ctx = Arc::clone(ctx);
        // The paths claimed by the records as they are: a check only drops records (and forgets
        // their claims), so a check still running after start-up never leaves a stale claim.
        blocking(move || {
            ctx.claims.reload_tolerant(&*ctx.store);
            format_intents(&ctx);
            Ok(ctx.store.recorded_volume_ids()?)
        })
        .await?
    };
    let mut report = RecoveryReport {
        volumes: ids.len(),
        ..Default::default()
    };
    let mut queue = ids.into_iter();
    let mut running = tokio::task::JoinSet::new();
    loop {
        while running.len() < PARALLEL
            && let Some(vol) = queue.next()
        {
            let ctx = Arc::clone(ctx);
            running.spawn(async move {
                // Calls that do not wait for readiness (the loop controller's) may hold the
                // guard: wait for it as long as for a check, and never pass a volume by
                // unchecked. Still held then: marked, so the background retry and the next call
                // on it check it before anything else.
                match lock_within(&ctx.locks, &vol, wait).await {
                    Some(guard) => attention::check(&ctx, &vol, guard, wait).await,
                    None => {
                        let why = format!(
                            "another call held it all through its start-up check ({} s); it \
                             is checked again before anything else is done with it",
                            wait.as_secs()
                        );
                        ctx.attention.mark(&vol, &why);
                        Checked::Refused(ebs_node_core::error::Error::Busy(vol))
                    }
                }
            });
        }
        let Some(done) = running.join_next().await else {
            break;
        };
        match done {
            Ok(Checked::Recovered(_guard, r)) => {
                report.dropped_stagings += usize::from(r.dropped_staging);
                report.dropped_publications += r.dropped_publications;
                report.completed += r.completed;
            }
            Ok(Checked::Refused(_)) | Err(_) => report.needing_attention += 1,
        }
    }
    // Volumes with a staged record or a publication are never pruned, so a check still running
    // (or a volume marked as needing attention) keeps its records.
    let pruning = Arc::clone(ctx);
    match blocking(move || prune_never_staged(&pruning.store)).await {
        Ok(n) => report.pruned = n,
        Err(e) => {
            tracing::warn!(error = %e, "recovery: records of never-staged volumes not pruned")
        }
    }
    let ctx = Arc::clone(ctx);
    match blocking(move || ebs_node_core::node::read_only::sweep(&ctx)).await {
        Ok(s) if s.detached + s.adopted > 0 => tracing::info!(
            detached = s.detached,
            adopted = s.adopted,
            "recovery: read-only block devices no record names: unused ones detached, used ones kept"
        ),
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "recovery: stray read-only block devices not swept"),
    }
    Ok(report)
}

/// Interrupted or failed mkfs runs, for the log; a format record that does not decode marks its
/// volume.
fn format_intents(ctx: &AgentCtx) {
    let ids = match ctx.store.known_volume_ids() {
        Ok(ids) => ids,
        Err(e) => {
            tracing::warn!(error = %e, "recovery: the volume list cannot be read");
            return;
        }
    };
    for id in ids {
        match ctx.store.format(&id) {
            Ok(Some(f)) if f.state == FormatState::Intent => {
                tracing::warn!(volume = %id, uuid = %f.uuid,
                    "recovery: an mkfs was interrupted or failed; the next stage formats again only if the device is still blank or carries that UUID");
            }
            Ok(_) => {}
            Err(e) => ctx.attention.mark(&id, &format!("its format record: {e}")),
        }
    }
}

/// The guard, waiting up to `wait` for a holder to let go (polled: holders are few and
/// short, and only start-up waits).
pub async fn lock_within(
    locks: &VolumeLocks,
    volume: &str,
    wait: std::time::Duration,
) -> Option<VolumeGuard> {
    let until = tokio::time::Instant::now() + wait;
    loop {
        if let Some(guard) = locks.try_lock(volume) {
            return Some(guard);
        }
        if tokio::time::Instant::now() >= until {
            return None;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Steps that only look at the host (find the volume's device, prove it is the volume's): a
/// call that ended in them changed nothing there, so its lines are kept only for a volume the
/// node knows. Otherwise every id a CO (or anyone on the socket) names would leave its lines
/// for good: 2000 stages of unknown ids took the state file from 73 KB to 4.4 MB.
const LOOKING_STEPS: [&str; 2] = [Step::LOOKING[0].name(), Step::LOOKING[1].name()];

/// Forgets, at start, the volumes that only journal lines of looking steps name (left by
/// agents before the journal kept such lines only for volumes it knows). Returns how many.
pub fn prune_never_staged(store: &Store) -> Result<usize> {
    let ids = store.journals_only_of(&LOOKING_STEPS)?;
    if !ids.is_empty() {
        store.write(Durability::Immediate, |w| {
            ids.iter().try_for_each(|id| w.forget_volume(id))
        })?;
    }
    Ok(ids.len())
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use ebs_node_core::records::{AccessRecord, DeviceIdentity, Progress, StagedVolume};
    use ebs_store::Store;

    use super::*;
    use ebs_node_backends::loopback::LoopBackend;
    use ebs_node_core::request::Roots;
    use ebs_node_host::fstools::FsTools;

    fn ctx(dir: &std::path::Path) -> Arc<AgentCtx> {
        let store = Arc::new(Store::open(&dir.join("state.redb")).expect("store"));
        Arc::new(
            AgentCtx::new(
                Arc::clone(&store),
                Arc::new(LoopBackend::new(Arc::clone(&store), dir)),
                Arc::new(ebs_node_host::real_host::RealHost {
                    fstools: FsTools::detect(),
                }),
                Roots::new(vec![dir.join("allowed")], vec![dir.to_path_buf()]),
                Arc::new(ebs_node_core::node::Unobserved),
                Default::default(),
                Default::default(),
            )
            .expect("context"),
        )
    }

    /// A volume recorded as staged whose staging mount is gone (a reboot): recovery drops it.
    fn staged_without_its_mount(ctx: &AgentCtx, dir: &std::path::Path) {
        let record = StagedVolume {
            volume_id: "v".into(),
            staging_path: dir.join("allowed/staging/v"),
            device: "/dev/loop-none".into(),
            devnum: None,
            identity: DeviceIdentity::Unverified,
            access: AccessRecord::Mount {
                fs_type: "ext4".into(),
                mount_flags: vec![],
            },
            access_mode: 1,
            readonly: false,
            progress: Progress::Complete,
            at_unix_ms: 1,
            attachment: None,
        };
        ctx.store
            .write(Durability::Immediate, |w| w.put_staged(&record))
            .expect("record");
    }

    fn temp(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("recov-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("allowed")).unwrap();
        dir
    }

    #[tokio::test]
    async fn a_volume_whose_guard_is_held_at_start_up_is_still_recovered() {
        let dir = temp("held");
        let ctx = ctx(&dir);
        staged_without_its_mount(&ctx, &dir);
        // A loop-controller call holds the volume while recovery reaches it, and ends.
        let held = ctx.locks.try_lock("v").expect("free");
        let release = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            drop(held);
        });
        let report = recover(&ctx, Duration::from_secs(5))
            .await
            .expect("recover");
        release.await.unwrap();
        assert_eq!(
            ctx.store.staged("v").unwrap().map(|s| s.staging_path),
            None,
            "the volume was passed by unchecked: its stale record stayed ({report:?})"
        );
        assert_eq!(report.dropped_stagings, 1, "{report:?}");
        assert!(!ctx.attention.is_marked("v"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_guard_held_all_through_start_up_leaves_the_volume_marked_then_checked() {
        let dir = temp("marked");
        let ctx = ctx(&dir);
        staged_without_its_mount(&ctx, &dir);
        let held = ctx.locks.try_lock("v").expect("free");
        let started = Instant::now();
        let report = recover(&ctx, Duration::from_millis(300))
            .await
            .expect("recover");
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(report.needing_attention, 1, "{report:?}");
        assert!(ctx.attention.is_marked("v"), "neither checked nor marked");
        drop(held);
        // The next call on the volume checks it first (as run_locked does).
        let guard = ctx.locks.try_lock("v").expect("free");
        let checked = attention::check(&ctx, "v", guard, Duration::from_secs(5)).await;
        assert!(matches!(checked, Checked::Recovered(..)));
        assert!(!ctx.attention.is_marked("v"));
        assert_eq!(ctx.store.staged("v").unwrap().map(|s| s.volume_id), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
