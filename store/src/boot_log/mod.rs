//! This boot's log of the state's writes: what outlives the agent's crash without an fsync.
//!
//! Every write the group commit takes is appended here in ticket order, before its caller
//! returns: a write(2) into the page cache, no fsync. A crash of the agent (a kill, an abort, the
//! OOM killer, a container restart) leaves the page cache as it was, so the next start on the same
//! boot replays what redb had not made durable. A power cut or a reboot takes the page cache, and
//! with it the mounts that a `Boot` write's intent guards (`Durability::Boot`): the header's boot
//! id then no longer matches, and the log is dropped whole. The header also names the state file
//! (a nonce kept in its META table), so a log never replays into a file made after it (`recover
//! --reset`).
//!
//! The log is a prefix of the writes, never one with a hole: after a failed append nothing is
//! appended until every write not logged is durable, and a `Boot` write is made durable
//! meanwhile. Two files take turns, so that a log under steady load is cut without a pause in
//! the writes: once the current one passes `SWITCH_BYTES` the next appends go to the other,
//! emptied once a durable commit holds its last ticket. A `Boot` write is made durable too when
//! the current file passes `FULL_BYTES` (no durable commit came for that long), which empties the
//! other and so bounds both.

mod codec;

use std::collections::BTreeSet;
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::StoreError;
use crate::writer::Op;
use codec::{Entry, HEADER_LEN};

const SWITCH_BYTES: u64 = 256 * 1024;
const FULL_BYTES: u64 = 4 * 1024 * 1024;
/// Past this a file is not read: no file this agent wrote gets near it.
const READ_LIMIT: u64 = 64 * 1024 * 1024;

/// A write as the log holds it.
pub(crate) type Logged = (u64, Vec<Op>);

pub(crate) struct BootLog {
    files: [File; 2],
    sizes: [u64; 2],
    current: usize,
    header: Vec<u8>,
    /// The last ticket of the other file while no durable commit is known to hold it.
    other_last: Option<u64>,
    /// The last ticket appended to the current file.
    current_last: Option<u64>,
    /// Appends stopped (a failed one) until every write not logged is durable.
    stopped: bool,
    /// A failed append's part could not be taken back: nothing written after it would be read.
    torn: bool,
    unlogged_max: u64,
    boot_id: [u8; 36],
    paths: [PathBuf; 2],
}

/// The two files beside the state file.
fn paths(state: &Path) -> [PathBuf; 2] {
    let name = |i: u8| {
        let mut s = state.as_os_str().to_owned();
        s.push(format!(".boot-log-{i}"));
        PathBuf::from(s)
    };
    [name(0), name(1)]
}

/// This boot's id, as the kernel gives it.
fn boot_id() -> std::io::Result<[u8; 36]> {
    let text = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")?;
    text.trim()
        .as_bytes()
        .try_into()
        .map_err(|_| std::io::Error::other(format!("unexpected boot id {:?}", text.trim())))
}

/// A nonce for a new state file: the log it writes names it.
pub(crate) fn new_nonce() -> u64 {
    let text = std::fs::read_to_string("/proc/sys/kernel/random/uuid").unwrap_or_default();
    let now = crate::now_unix_ms();
    codec::checksum(format!("{text}{now}{}", std::process::id()).as_bytes())
}

/// A file's bytes, from its start, whatever the offset its appends left.
fn read_whole(file: &File) -> std::io::Result<Vec<u8>> {
    let len = file.metadata()?.len().min(READ_LIMIT);
    let mut bytes = vec![0; usize::try_from(len).map_err(std::io::Error::other)?];
    file.read_exact_at(&mut bytes, 0)?;
    Ok(bytes)
}

/// Opens one of the files without following a link, and only if it is a regular file.
fn open_file(path: &Path) -> std::io::Result<File> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    Ok(file)
}

/// One of the files as a start finds it: made afresh where there was none; an error where one
/// is there but cannot be read whole (it may hold writes the state file lacks).
fn found_file(path: &Path) -> Result<Option<File>, StoreError> {
    let unusable = |detail: String| StoreError::BootLog {
        path: path.to_path_buf(),
        detail,
    };
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => match open_file(path) {
            Ok(file) => Ok(Some(file)),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e,
                    "no boot log: every write that guards a mount is made durable");
                Ok(None)
            }
        },
        Err(e) => Err(unusable(e.to_string())),
        Ok(m) if !m.file_type().is_file() => Err(unusable("not a regular file".into())),
        Ok(m) if m.len() > READ_LIMIT => Err(unusable(format!(
            "{} bytes, more than any log the agent writes",
            m.len()
        ))),
        Ok(_) => open_file(path)
            .map(Some)
            .map_err(|e| unusable(e.to_string())),
    }
}

/// Refuses a pair of log files that are not two files of their own: each emptied in turn, one
/// that is the other (a hard link) lost the writes it held, and one that is the state file
/// truncated it (an eighty-first fresh review's F1 and F2, root only).
fn distinct(state: &Path, files: [(&File, &Path); 2]) -> Result<(), StoreError> {
    use std::os::unix::fs::MetadataExt;
    let state_id = std::fs::metadata(state).map(|m| (m.dev(), m.ino())).ok();
    let mut seen = Vec::new();
    for (file, path) in files {
        let refused = |detail: &str| StoreError::BootLog {
            path: path.to_path_buf(),
            detail: detail.into(),
        };
        let m = file.metadata().map_err(|e| refused(&e.to_string()))?;
        let id = (m.dev(), m.ino());
        if m.nlink() != 1 {
            return Err(refused("it has other names (a hard link)"));
        }
        if Some(id) == state_id || seen.contains(&id) {
            return Err(refused("it is the state file or the other log file"));
        }
        seen.push(id);
    }
    Ok(())
}

/// What the two files held of the state file's writes on this boot.
#[derive(Default)]
pub(crate) struct Held {
    /// In ticket order, without those of failed batches.
    pub(crate) writes: Vec<Logged>,
    /// Every ticket the log accounts for: its writes and its failed batches'.
    pub(crate) tickets: BTreeSet<u64>,
}

impl BootLog {
    /// Opens the log of the state file at `state` with what it holds of this boot's writes of
    /// the file named by `nonce` (none for a file that never had a log); `begin` empties it.
    /// `None` when it cannot be kept (then every `Boot` write is made durable); an error when a
    /// file is there that cannot be read whole.
    pub(crate) fn open(
        state: &Path,
        nonce: Option<u64>,
    ) -> Result<Option<(BootLog, Held)>, StoreError> {
        let names = paths(state);
        let (a, b) = (found_file(&names[0])?, found_file(&names[1])?);
        if let (Some(a), Some(b)) = (&a, &b) {
            distinct(state, [(a, &names[0]), (b, &names[1])])?;
        }
        let id = match boot_id() {
            Ok(id) => id,
            Err(e) => {
                tracing::warn!(error = %e,
                    "no boot log (this boot's id cannot be read): every write that guards a mount is made durable");
                return Ok(None);
            }
        };
        let (Some(a), Some(b)) = (a, b) else {
            return Ok(None);
        };
        let mut log = BootLog {
            files: [a, b],
            sizes: [0, 0],
            current: 0,
            header: Vec::new(),
            other_last: None,
            current_last: None,
            stopped: false,
            torn: false,
            unlogged_max: 0,
            boot_id: id,
            paths: names,
        };
        let held = match nonce {
            Some(nonce) => {
                log.header = codec::header(&id, nonce);
                log.read_held(0, u64::MAX)?
            }
            None => Held::default(),
        };
        Ok(Some((log, held)))
    }

    /// Empties both files for this run's writes, named by the file's new `nonce`, once what
    /// they held is durable elsewhere.
    pub(crate) fn begin(mut self, state: &Path, nonce: u64) -> Option<BootLog> {
        self.header = codec::header(&self.boot_id, nonce);
        match self.reset() {
            Ok(()) => Some(self),
            Err(e) => {
                tracing::warn!(state = %state.display(), error = %e,
                    "no boot log: every write that guards a mount is made durable");
                None
            }
        }
    }

    /// Empties both files: a clean stop left everything durable.
    pub(crate) fn clear(&mut self) {
        if self.reset().is_err() {
            self.stop();
        }
    }

    /// Whether a `Boot` write must be made durable instead: the log stopped, or full.
    pub(crate) fn wants_durable(&self) -> bool {
        self.stopped || self.sizes[self.current] >= FULL_BYTES
    }

    /// Appends a write; false if it is not in the log (stopped, or this append failed).
    pub(crate) fn append(&mut self, ticket: u64, ops: &[Op]) -> bool {
        if self.stopped {
            self.unlogged_max = self.unlogged_max.max(ticket);
            return false;
        }
        if self.sizes[self.current] >= SWITCH_BYTES && self.other_last.is_none() {
            self.current = 1 - self.current;
            self.other_last = self.current_last.take();
        }
        let appended = codec::write_frame(ticket, ops).is_some_and(|f| self.put(&f));
        if appended {
            self.current_last = Some(ticket);
        } else {
            self.unlogged_max = self.unlogged_max.max(ticket);
        }
        appended
    }

    /// Records that these tickets' batch failed: a replay leaves them out. Tried even while
    /// stopped (the frames of the batch may be in the log), unless a frame cut short is left at
    /// its end, behind which nothing is read.
    pub(crate) fn void(&mut self, tickets: &[u64]) {
        if !self.torn
            && let Some(f) = codec::void_frame(tickets)
        {
            self.put(&f);
        }
    }

    /// A durable commit holds every ticket up to `covered`: what the log holds only of those
    /// is dropped, and a stopped log starts again once nothing it left out is still lazy.
    pub(crate) fn durable_through(&mut self, covered: u64) {
        if self.stopped {
            if self.unlogged_max <= covered && self.reset().is_ok() {
                self.stopped = false;
            }
            return;
        }
        let other = 1 - self.current;
        if self.other_last.is_some_and(|t| t <= covered) {
            if self.empty(other).is_err() {
                return self.stop();
            }
            self.other_last = None;
        }
        if self.other_last.is_none() && self.current_last.is_some_and(|t| t <= covered) {
            if self.empty(self.current).is_err() {
                return self.stop();
            }
            self.current_last = None;
        }
    }

    /// The writes held with tickets in `(after, through]`, in ticket order, without those of
    /// failed batches: what a reopened file lost since its last durable commit.
    pub(crate) fn read_since(&self, after: u64, through: u64) -> Vec<Logged> {
        match self.read_held(after, through) {
            Ok(held) => held.writes,
            Err(e) => {
                tracing::warn!(error = %e, "the boot log cannot be read: its writes are not replayed");
                Vec::new()
            }
        }
    }

    /// What both files hold with tickets in `(after, through]`.
    fn read_held(&self, after: u64, through: u64) -> Result<Held, StoreError> {
        let mut held = Held::default();
        let mut voided = BTreeSet::new();
        for (file, path) in self.files.iter().zip(&self.paths) {
            let bytes = read_whole(file).map_err(|e| StoreError::BootLog {
                path: path.clone(),
                detail: e.to_string(),
            })?;
            for entry in codec::entries(&bytes, &self.header) {
                match entry {
                    Entry::Write(t, ops) if t > after && t <= through => {
                        held.tickets.insert(t);
                        held.writes.push((t, ops));
                    }
                    Entry::Write(..) => {}
                    Entry::Void(tickets) => voided.extend(tickets),
                }
            }
        }
        held.writes.retain(|(t, _)| !voided.contains(t));
        held.writes.sort_by_key(|(t, _)| *t);
        held.writes.dedup_by_key(|(t, _)| *t);
        // (A range whose start is past its end panics: a reopen whose last durable commit is
        // its last applied batch asks for none.)
        if after < through {
            held.tickets.extend(voided.range(after + 1..=through));
        }
        Ok(held)
    }

    /// Both files back to their header.
    fn reset(&mut self) -> std::io::Result<()> {
        self.empty(0)?;
        self.empty(1)?;
        self.torn = false;
        self.current = 0;
        self.other_last = None;
        self.current_last = None;
        Ok(())
    }

    fn empty(&mut self, i: usize) -> std::io::Result<()> {
        let file = &mut self.files[i];
        file.set_len(0)?;
        file.write_all(&self.header)?;
        self.sizes[i] = HEADER_LEN as u64;
        Ok(())
    }

    /// Appends a frame whole, or takes a part of it back and stops.
    fn put(&mut self, frame: &[u8]) -> bool {
        let i = self.current;
        if self.files[i].write_all(frame).is_ok() {
            self.sizes[i] += frame.len() as u64;
            return true;
        }
        // A part written would end every later read there; whatever is past the last whole
        // frame goes, and nothing more is appended until what is left out is durable.
        if self.files[i].set_len(self.sizes[i]).is_err() {
            tracing::warn!("a failed boot log append could not be taken back");
            self.torn = true;
        }
        self.stop();
        false
    }

    fn stop(&mut self) {
        if !self.stopped {
            tracing::warn!(
                "boot log stopped: writes that guard a mount are made durable until it starts again"
            );
        }
        self.stopped = true;
        // Starting again empties both files: what they hold must be durable first.
        let logged = self.current_last.max(self.other_last).unwrap_or(0);
        self.unlogged_max = self.unlogged_max.max(logged);
    }
}

#[cfg(test)]
mod tests;
