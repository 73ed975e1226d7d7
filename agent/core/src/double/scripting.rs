//! How a test sets the double up and reads it back: devices, scripted failures, foreign mounts,
//! and the calls recorded with the journal line (and its durability) before each.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use super::ledger::MemLedger;
use crate::DevNum;
use crate::probe::ProbeOutcome;
use crate::seam::MountFacts;

use super::host::{Call, DoubleHost, State, mount_facts};

impl DoubleHost {
    pub fn new(ledger: Arc<MemLedger>, watched: &str, dir: &Path) -> Arc<Self> {
        Arc::new_cyclic(|me| DoubleHost {
            ledger,
            watched: watched.to_string(),
            dir: dir.to_path_buf(),
            state: Mutex::default(),
            me: me.clone(),
        })
    }

    pub fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new device file of `bytes`, blank.
    pub fn add_device(&self, name: &str, bytes: u64) -> PathBuf {
        let path = self.dir.join("dev").join(name);
        std::fs::create_dir_all(self.dir.join("dev")).expect("dev dir");
        std::fs::write(&path, b"").expect("device file");
        let mut s = self.state();
        s.next_minor += 1;
        let devnum = DevNum::new(259, s.next_minor);
        s.devices.insert(path.clone(), devnum);
        s.device_bytes.insert(devnum, bytes);
        s.probes.insert(devnum, ProbeOutcome::Blank);
        path
    }

    pub fn devnum(&self, path: &Path) -> DevNum {
        self.state().devices[path]
    }

    /// The names of the calls that changed the host, in order.
    pub fn calls(&self) -> Vec<String> {
        self.state().calls.iter().map(|c| c.what.clone()).collect()
    }

    /// The calls that changed the host, each with the journal line committed before it.
    pub fn calls_after(&self) -> Vec<(String, Option<String>)> {
        self.state()
            .calls
            .iter()
            .map(|c| (c.what.clone(), c.after.clone()))
            .collect()
    }

    /// The calls that changed the host, each with the journal line on disk before it: the last
    /// one committed, if that commit was durable.
    pub fn durable_before(&self) -> Vec<(String, Option<String>)> {
        self.state()
            .calls
            .iter()
            .map(|c| (c.what.clone(), c.after.clone().filter(|_| c.durable)))
            .collect()
    }

    pub fn fail(&self, call: &'static str, why: &str) {
        self.state().fail.insert(call, why.to_string());
    }

    pub fn mounts_at(&self, path: &Path) -> usize {
        self.state().mounts.get(path).map_or(0, Vec::len)
    }

    /// Puts a mount that is not the volume's at `path` (another filesystem's root).
    pub fn foreign_mount(&self, path: &Path) {
        let facts = mount_facts(DevNum::new(8, 99), "ext4", false);
        self.state()
            .mounts
            .entry(path.to_path_buf())
            .or_default()
            .push(facts);
    }

    /// The text a question of the host (not a change: nothing is recorded) is scripted to fail
    /// with: "examine" (paths), "mkdir" (entries made), "mounted_at" (the mount table).
    pub(super) fn scripted(&self, question: &str) -> Option<String> {
        self.state().fail.get(question).cloned()
    }

    /// Paths cannot be examined when scripted so (EIO below a dead mount, as the host says).
    pub(super) fn examinable(&self) -> Result<(), crate::node::host::PathRefusal> {
        match self.scripted("examine") {
            Some(why) => Err(crate::node::host::PathRefusal::Unexaminable(
                io::Error::other(why),
            )),
            None => Ok(()),
        }
    }

    /// Records a call that changes the host; fails it when scripted to.
    pub(super) fn act(&self, what: String, name: &'static str) -> io::Result<()> {
        let after = self.ledger.journal(&self.watched).last().map(super::line);
        let durable = self.ledger.last_write_durable();
        let mut s = self.state();
        s.calls.push(Call {
            what,
            after,
            durable,
        });
        match s.fail.get(name) {
            Some(why) => Err(io::Error::other(why.clone())),
            None => Ok(()),
        }
    }

    /// The top mount at `path`; `nodev` unless `State::dev_allowed` says otherwise.
    pub(super) fn top(&self, path: &Path) -> Option<MountFacts> {
        let s = self.state();
        let mut top = s.mounts.get(path).and_then(|m| m.last().cloned())?;
        top.vfs_bits &= !crate::request::ms::NODEV;
        if !s.dev_allowed.contains(path) {
            top.vfs_bits |= crate::request::ms::NODEV;
        }
        Some(top)
    }

    pub(super) fn name(path: &Path) -> String {
        path.file_name().map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into(),
        )
    }
}
