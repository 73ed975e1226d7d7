//! The volume's device as the node steps use it: held open from the moment its identity is
//! proven (so its number cannot pass to another disk), one operation per device, and proven again
//! right before every host mutation that names it (mkfs, e2fsck, mount, bind, resize, trim).

use crate::DevNum;
use std::path::Path;

use crate::ledger::{LedgerResult, LedgerWriter};
use crate::records::{AccessRecord, ClaimDoor, DeviceClaim, DeviceIdentity, StagedVolume};

use super::backend::{ResolvedDevice, Shown};
use super::host::DeviceHandle;
use super::{NodeCtx, VolumeGuard};
use crate::error::{Error, Result};
use crate::request::VolumeId;

pub struct VolumeDevice {
    pub held: Box<dyn DeviceHandle>,
    pub identity: DeviceIdentity,
    volume: String,
    _turn: VolumeGuard,
    /// The device's identity taken (one door at a time per identity, whatever its numbers: a
    /// file bound to two loop devices is one device), with the claim to write, if any.
    claim: Option<Claim>,
    /// The other devices showing its bytes, held idle for the call (`views`).
    _views: super::host::HeldViews,
}

struct Claim {
    _turn: VolumeGuard,
    pending: Option<(String, DeviceClaim)>,
}

impl VolumeDevice {
    /// Holds a device the backend just resolved for `volume`, and proves it on the held fd.
    pub fn hold(
        ctx: &NodeCtx,
        volume: &VolumeId,
        resolved: &ResolvedDevice,
    ) -> Result<VolumeDevice> {
        Self::hold_path(ctx, volume.as_str(), &resolved.path, &resolved.identity)
    }

    /// Holds the device a staged record names, proven to still be the volume: a detach and a new
    /// attach reuse device numbers, so the recorded path alone proves nothing.
    /// A device another id holds is not the volume's, whatever its record says (records from
    /// before device claims existed).
    pub fn hold_recorded(ctx: &NodeCtx, staged: &StagedVolume) -> Result<VolumeDevice> {
        let device = Self::hold_path(ctx, &staged.volume_id, &staged.device, &staged.identity)?;
        if staged.identity == DeviceIdentity::Unverified
            && !super::identity::same_attachment(ctx, staged, device.devnum())
        {
            return Err(device.wrong(
                "another attachment is at its numbers now (the device it was staged on was \
                 detached since, and another attached)"
                    .into(),
            ));
        }
        if let Some(owner) =
            super::device_claim::node_owner(&*ctx.ledger, &device.identity, Some(device.devnum()))?
            && owner != staged.volume_id
        {
            return Err(Error::DeviceClaimed {
                device: device.path().to_path_buf(),
                volume: staged.volume_id.clone(),
                owner,
                door: super::device_claim::door_words(ClaimDoor::Node),
            });
        }
        Ok(device)
    }

    fn hold_path(
        ctx: &NodeCtx,
        volume: &str,
        path: &Path,
        identity: &DeviceIdentity,
    ) -> Result<VolumeDevice> {
        let held = ctx.host.open_device(path).map_err(|e| Error::WrongDevice {
            volume: volume.to_string(),
            device: path.to_path_buf(),
            reason: format!("it cannot be opened ({e}); the volume is not attached there"),
        })?;
        let devnum = held.devnum();
        let turn = ctx
            .device_locks
            .try_lock(&devnum.to_string())
            .ok_or_else(|| Error::DeviceBusy {
                path: path.to_path_buf(),
                devnum,
            })?;
        let device = VolumeDevice {
            held,
            identity: identity.clone(),
            volume: volume.to_string(),
            _turn: turn,
            claim: None,
            _views: super::host::HeldViews::default(),
        };
        device.prove(ctx)?;
        Ok(device)
    }

    /// Takes the device for `volume` through the node (see `device_claim`): refuses when another
    /// id holds it; otherwise the claim to write, if `volume` does not hold it yet, is kept for
    /// the first intent's commit (`put_claim`).
    pub fn take_for_node(
        &mut self,
        ctx: &NodeCtx,
        volume: &VolumeId,
        acts_for: Option<&str>,
    ) -> Result<()> {
        let devnum = self.devnum();
        let key = super::device_claim::node_key(ctx, &self.identity, devnum)
            .unwrap_or_else(|| format!("node/dev:{devnum}"));
        let turn = ctx
            .device_locks
            .try_lock(&key)
            .ok_or_else(|| Error::DeviceBusy {
                path: self.path().to_path_buf(),
                devnum,
            })?;
        let pending = super::device_claim::take_for_node(
            ctx,
            volume,
            acts_for,
            &self.identity,
            devnum,
            self.path(),
        )?;
        self.refuse_raw_use(ctx)?;
        self._views =
            super::views::refuse_used_and_hold(ctx, volume.as_str(), devnum, self.path())?;
        self.claim = Some(Claim {
            _turn: turn,
            pending,
        });
        Ok(())
    }

    /// Refuses to hand the device out raw while something mounts or claims it (a filesystem
    /// mounted from it elsewhere would be written under: a thirtieth fresh review's F1).
    pub fn refuse_if_used_raw(&self, ctx: &NodeCtx) -> Result<()> {
        if ctx
            .host
            .still_claimed(self.devnum(), Some(self.held.file()))
        {
            return Err(Error::DeviceInUse {
                path: self.path().to_path_buf(),
                why: "mounted or claimed elsewhere; a raw block volume is handed out only while \
                      nothing else uses its device"
                    .into(),
            });
        }
        Ok(())
    }

    /// Raw use the kernel's claim does not show (a bound node: a raw block publication, this
    /// agent's after a reset or anyone's; a holder) makes the device someone's. Only a volume
    /// staged for raw block access has binds of its own (its publications, and kubelet's copies
    /// of them in its pods' namespaces), so only its staging is let be; a filesystem staging has
    /// none, whether its record is there or not (a thirty-second fresh review's F1: a re-stage
    /// whose mount was gone, with a record, fsck'd and mounted a device bound elsewhere).
    fn refuse_raw_use(&self, ctx: &NodeCtx) -> Result<()> {
        let staged = ctx.ledger.staged(&self.volume)?;
        if staged.is_some_and(|s| matches!(s.access, AccessRecord::Block)) {
            return Ok(());
        }
        let used = ctx.host.raw_use(self.devnum(), self.path()).map_err(|e| {
            Error::io(
                format!("finding what uses {} raw", self.path().display()),
                e,
            )
        })?;
        match used {
            Some(at) => Err(Error::DeviceStillBound {
                device: self.path().to_path_buf(),
                at: at.trim_start_matches('(').trim_end_matches(')').to_string(),
            }),
            None => Ok(()),
        }
    }

    /// The other views, and raw use of the device itself, checked again while the device is in
    /// use (after the stage's mount): a view used, or a bind of the node made, since the first
    /// scan (the twenty-seventh fresh review's F5; the thirty-second's F2 for a bind made during
    /// mkfs).
    pub fn recheck_views(&self, ctx: &NodeCtx) -> Result<()> {
        super::views::recheck(ctx, &self.volume, self.devnum(), self.path(), &self._views)?;
        self.refuse_raw_use(ctx)
    }

    /// A held device's other views checked and held, as a take does: for a door that hands out a
    /// device it took before (a raw block publish).
    pub fn hold_views(&mut self, ctx: &NodeCtx) -> Result<()> {
        let devnum = self.devnum();
        self._views = super::views::refuse_used_and_hold(ctx, &self.volume, devnum, self.path())?;
        Ok(())
    }

    /// The claim a commit must carry for the device to be this volume's: nothing when the volume
    /// held it already.
    pub fn pending_claim(&self) -> Option<(String, DeviceClaim)> {
        self.claim.as_ref().and_then(|c| c.pending.clone())
    }

    pub fn path(&self) -> &Path {
        self.held.path()
    }

    pub fn devnum(&self) -> DevNum {
        self.held.devnum()
    }

    /// The held device carries the volume's identity (an unverified one, by explicit choice,
    /// only needs the device to be the one held).
    fn prove(&self, ctx: &NodeCtx) -> Result<()> {
        if self.identity == DeviceIdentity::Unverified {
            return Ok(());
        }
        ctx.backend
            .prove(Shown::Held(self.held.file(), self.devnum()), &self.identity)
            .map(drop)
            .map_err(|reason| self.wrong(reason.to_string()))
    }

    /// Right before a host mutation: the path still names the held device, and the device still
    /// carries the volume.
    pub fn reverify(&self, ctx: &NodeCtx) -> Result<()> {
        self.held
            .still_at_path()
            .map_err(|e| self.wrong(e.to_string()))?;
        self.prove(ctx)
    }

    fn wrong(&self, reason: String) -> Error {
        Error::WrongDevice {
            volume: self.volume.clone(),
            device: self.path().to_path_buf(),
            reason,
        }
    }
}

/// Adds a pending claim (`VolumeDevice::pending_claim`) to a commit.
pub fn put_claim(
    w: &mut dyn LedgerWriter,
    claim: &Option<(String, DeviceClaim)>,
) -> LedgerResult<()> {
    match claim {
        Some((key, claim)) => w.put_claim(key, claim),
        None => Ok(()),
    }
}
