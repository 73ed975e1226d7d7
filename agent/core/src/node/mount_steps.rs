//! The steps of a stage that finds nothing mounted yet: probe, format (only when provably
//! blank) or check, then mount, each journaled before the host is touched.

use crate::records::{DeviceClaim, Durability, FormatRecord, FormatState, Phase, StagedVolume};

use super::format::{self, format_device, format_record};
use super::grow::grow_offline_if_needed;
use super::host::Entry;
use super::journal::{Journal, detail};
use super::volume_device::{VolumeDevice, put_claim};
use super::{NodeCtx, path_string};
use crate::error::{Error, Result};
use crate::format::{Decision, Existing, decide};
use crate::request::{FsType, MountFlags};
use crate::seam::FsckOutcome;
use crate::steps::Step;

use super::stage::StageCommand;

/// Probe, format or check, mount: the steps of a stage that finds nothing mounted yet.
pub(super) struct MountSteps<'a> {
    pub(super) ctx: &'a NodeCtx,
    pub(super) journal: &'a Journal<'a>,
    pub(super) cmd: &'a StageCommand,
    pub(super) fs: FsType,
    pub(super) flags: &'a MountFlags,
    pub(super) readonly: bool,
    pub(super) format: Option<&'a FormatRecord>,
    /// The device's claim, written with the first intent if the volume did not hold it yet.
    pub(super) claim: &'a Option<(String, DeviceClaim)>,
}

impl MountSteps<'_> {
    /// Returns whether the filesystem is known to fill the device.
    pub(super) fn run(
        &self,
        device: &mut VolumeDevice,
        staging: &dyn Entry,
        record: &mut StagedVolume,
    ) -> Result<bool> {
        let (ctx, journal, fs) = (self.ctx, self.journal, self.fs);
        let vol = journal.volume();
        // Held exclusively while it is probed and judged: a concurrent mkfs, or a mount of the
        // device elsewhere, fails here instead of racing with us.
        device
            .held
            .claim_exclusive()
            .map_err(|e| Error::DeviceInUse {
                path: device.path().to_path_buf(),
                why: e.to_string(),
            })?;
        let probed = journal.step(
            Step::Probe,
            detail([("device", path_string(device.path()))]),
            Durability::Lazy,
            || ctx.host.probe(device.path(), fs),
        )?;
        // Validated options; for xfs they include `nouuid` (see request::mount_flags).
        let data = self.flags.data().to_vec();
        let staging_path = self.cmd.staging.as_path();
        let facts = detail([
            ("device", path_string(device.path())),
            ("staging", path_string(staging_path)),
            ("options", data.join(",")),
            ("readonly", self.readonly.to_string()),
        ]);
        let mount_intent = || {
            journal.record(
                Step::Mount,
                Phase::Intent,
                facts.clone(),
                Durability::Immediate,
                |w| {
                    put_claim(w, self.claim)?;
                    w.put_staged(record)
                },
            )
        };
        let record = self.format.map(format::view);
        let decision = {
            let evidence = ctx.host.evidence(&*ctx.backend, device);
            decide(&*evidence, vol.as_str(), fs, record, probed, self.readonly)?
        };
        let size_settled = match decision {
            Decision::Format { uuid } => {
                format_device(
                    ctx,
                    journal,
                    fs,
                    device,
                    &uuid,
                    &self.cmd.format,
                    self.claim,
                )?;
                mount_intent()?;
                true
            }
            // The intent must be on disk before mount(2), not before the fsck: committing it
            // while e2fsck runs takes its fsync off the stage's critical path.
            Decision::Check(found) => {
                device.held.release_exclusive();
                alongside(mount_intent, || self.check_existing(device, found))?;
                // The offline check covers ext; xfs grows only mounted.
                fs.is_ext()
            }
        };
        // xfs needs no fsck: its log is replayed by the kernel at mount.
        let mounted = device.reverify(ctx).and_then(|()| {
            let target = staging
                .open_entry()
                .map_err(|e| Error::io(format!("opening {}", staging_path.display()), e))?;
            target
                .mount_device(
                    device.path(),
                    fs,
                    self.flags.vfs_bits() | super::adopted::NO_DEVICES,
                    &data,
                    self.readonly,
                )
                .map_err(|e| {
                    Error::io(
                        format!(
                            "mounting {} on {} with options {}",
                            device.path().display(),
                            staging_path.display(),
                            data.join(",")
                        ),
                        e,
                    )
                })
        });
        // A view of the bytes attached since the first scan and used before this mount, or a
        // bind of the node made meanwhile: the mount comes down again (it is this call's own,
        // just made) and the stage is refused. A step of its own, so that a crash between the
        // mount and this answer is a point the crash matrix reaches: recovery asks it again
        // before it completes the stage (`interrupted`).
        let failed = mounted.map_err(|e| (Step::Mount, e)).and_then(|()| {
            journal.note(Step::Mount, Phase::Done, facts.clone());
            journal.note(Step::Recheck, Phase::Intent, facts.clone());
            device.recheck_views(ctx).map_err(|e| {
                if let Err(undo) = staging.unmount() {
                    tracing::warn!(volume = %vol, error = %undo,
                        "the mount of a refused stage could not be taken down; the next unstage does");
                }
                (Step::Recheck, e)
            })
        });
        if let Err((step, e)) = failed {
            // Nothing is mounted: the record goes, so that a corrected retry (other options,
            // another path) is not held to this one.
            let mut failed = facts;
            failed.insert("error".into(), e.to_string());
            let _ = journal.record(step, Phase::Failed, failed, Durability::Lazy, |w| {
                w.delete_staged(vol.as_str())
            });
            return Err(e);
        }
        journal.note(Step::Recheck, Phase::Done, facts);
        Ok(size_settled)
    }

    /// Uses the filesystem already on the device: records it as ours if it was made elsewhere,
    /// checks it, and grows it offline when the device grew.
    fn check_existing(&self, device: &VolumeDevice, found: Existing) -> Result<()> {
        let (ctx, journal, fs) = (self.ctx, self.journal, self.fs);
        let Existing {
            uuid,
            adopt,
            fs_bytes,
        } = found;
        if adopt {
            let fact = format_record(ctx, journal.volume(), fs, &uuid, device, FormatState::Done);
            ctx.ledger
                .write(Durability::Immediate, Box::new(|w| w.put_format(&fact)))?;
        }
        if self.readonly {
            return Ok(());
        }
        device.reverify(ctx)?;
        let outcome = journal.step(
            Step::Check,
            detail([("device", path_string(device.path())), ("uuid", uuid)]),
            Durability::Lazy,
            || Ok(ctx.host.fsck(fs, device.path())?),
        )?;
        if let FsckOutcome::Repaired(code) = outcome {
            tracing::warn!(
                volume = %journal.volume(),
                code,
                "e2fsck repaired the filesystem"
            );
        }
        grow_offline_if_needed(ctx, journal, fs, device.path(), fs_bytes)?;
        Ok(())
    }
}

/// Runs `side` on a second thread while `main` runs here; both must succeed. If no thread can be
/// started (a thread limit), `side` runs here afterwards.
fn alongside(
    side: impl Fn() -> Result<()> + Sync,
    main: impl FnOnce() -> Result<()>,
) -> Result<()> {
    std::thread::scope(|s| {
        let spawned = std::thread::Builder::new().spawn_scoped(s, &side);
        let main = main();
        let side = match spawned {
            Ok(handle) => handle.join().unwrap_or_else(|_| {
                Err(Error::Panicked {
                    what: "the journal writer".into(),
                })
            }),
            Err(e) => {
                tracing::debug!(error = %e, "no thread for the journal writer; writing in turn");
                side()
            }
        };
        main.and(side)
    })
}
