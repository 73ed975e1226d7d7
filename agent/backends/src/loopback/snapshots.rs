//! Snapshots of loop volumes: point-in-time copies of the volume file under
//! `<state-dir>/snapshots/` (see `copies` for how they are made consistent). A snapshot is
//! independent of its volume once taken: deleting the volume leaves its snapshots, and volumes
//! restored from them, intact.

use ebs_node_core::records::{Durability, LoopSnapshot, now_unix_ms};

use super::LoopController;
use super::paging::{Page, page};
use ebs_node_core::error::{ControllerError, Error, Result};

pub const SNAPSHOT_PREFIX: &str = "snap-";

/// ListSnapshots' filters and paging.
#[derive(Default)]
pub struct SnapshotQuery {
    pub snapshot_id: String,
    pub source_volume_id: String,
    pub max_entries: usize,
    pub starting_token: String,
}

impl LoopController {
    /// Takes a snapshot, or returns the one of that name (ALREADY_EXISTS when it is of another
    /// volume). The caller holds the node guards of the volume and of the snapshot's name.
    pub fn create_snapshot(&self, name: &str, source_volume_id: &str) -> Result<LoopSnapshot> {
        let (snapshot, volume) = {
            let _guard = self.lock();
            let existing = self
                .store
                .loop_snapshots()?
                .into_iter()
                .find(|s| s.name == name);
            if let Some(s) = &existing
                && s.source_volume_id != source_volume_id
            {
                return Err(ControllerError::SnapshotNameTaken {
                    name: name.to_string(),
                    existing: s.id.clone(),
                    of_volume: s.source_volume_id.clone(),
                }
                .into());
            }
            let volume = self
                .store
                .loop_volume(source_volume_id)?
                .ok_or_else(|| Error::VolumeNotFound(source_volume_id.into()))?;
            self.refuse_if_making(source_volume_id)?;
            if let Some(s) = &existing
                && s.ready
            {
                return Ok(s.clone());
            }
            let snapshot = match existing {
                // Interrupted before its copy was complete: taken again, now.
                Some(s) => s,
                None => {
                    let id = format!("{SNAPSHOT_PREFIX}{}", super::controller::random_hex()?);
                    let s = LoopSnapshot {
                        file: self.snapshots_dir.join(format!("{id}.img")),
                        id,
                        name: name.into(),
                        source_volume_id: source_volume_id.into(),
                        size_bytes: volume.capacity_bytes,
                        created_unix_ms: now_unix_ms(),
                        ready: false,
                    };
                    self.store
                        .write(Durability::Immediate, |w| w.put_loop_snapshot(&s))?;
                    s
                }
            };
            (snapshot, volume)
        };
        ebs_node_host::private::ensure_dir(&self.snapshots_dir)
            .map_err(|e| Error::io(format!("creating {}", self.snapshots_dir.display()), e))?;
        if let Err(e) = self.copy_volume(&volume, &snapshot.file, volume.capacity_bytes) {
            // Nothing was copied (a freeze refused, a copy failed): the record goes, so that no
            // restart takes it for a copy a crash cut and thaws a freeze that is someone else's
            // (a thirtieth fresh review's F3). A crash keeps it, for start-up's thaw.
            let _guard = self.lock();
            super::copies::remove_partial(&snapshot.file)?;
            self.store.write(Durability::Immediate, |w| {
                w.delete_loop_snapshot(&snapshot.id)
            })?;
            return Err(e);
        }
        let _guard = self.lock();
        let snapshot = LoopSnapshot {
            size_bytes: volume.capacity_bytes,
            created_unix_ms: now_unix_ms(),
            ready: true,
            ..snapshot
        };
        self.store
            .write(Durability::Immediate, |w| w.put_loop_snapshot(&snapshot))?;
        Ok(snapshot)
    }

    /// Deletes a snapshot and its file; an unknown id is already gone. Volumes restored from it
    /// are copies and stay.
    pub fn delete_snapshot(&self, id: &str) -> Result<()> {
        let _guard = self.lock();
        let Some(snapshot) = self.store.loop_snapshot(id)? else {
            return Ok(());
        };
        // A loop device still bound to the file (made by anyone) keeps the snapshot's bytes
        // reachable: removing the file under it would only hide them.
        super::in_use::refuse_if_any_loop_over(id, &snapshot.file)?;
        for file in [
            snapshot.file.clone(),
            snapshot.file.with_extension("img.partial"),
        ] {
            match std::fs::remove_file(&file) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(Error::io(format!("removing {}", file.display()), e)),
            }
        }
        self.store
            .write(Durability::Immediate, |w| w.delete_loop_snapshot(id))?;
        Ok(())
    }

    pub fn get_snapshot(&self, id: &str) -> Result<LoopSnapshot> {
        self.store
            .loop_snapshot(id)?
            .ok_or_else(|| ControllerError::SnapshotNotFound { id: id.to_string() }.into())
    }

    /// Snapshots in id order, filtered, one page at a time.
    pub fn list_snapshots(&self, q: &SnapshotQuery) -> Result<Page<LoopSnapshot>> {
        let all = self
            .store
            .loop_snapshots()?
            .into_iter()
            .filter(|s| q.snapshot_id.is_empty() || s.id == q.snapshot_id)
            .filter(|s| q.source_volume_id.is_empty() || s.source_volume_id == q.source_volume_id)
            .collect();
        page(
            all,
            |s| s.id.as_str(),
            SNAPSHOT_PREFIX,
            q.max_entries,
            &q.starting_token,
        )
    }
}
