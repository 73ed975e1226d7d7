//! The recording double of the host, for the core's own unit tests and the simulation, and for
//! the daemon's table tests at the gRPC boundary (the `double` feature, which only test builds
//! turn on: a release build never has it). Devices are plain files given device numbers
//! (`devices`), the mount table a stack of mounts per path (`host`), paths real entries in a
//! scratch directory (`entries`), the ledger in memory (`ledger`), failures scripted by call
//! name (`scripting`), usage and health scripted per device (`health`). `Harness` is a node
//! context over all of them.
// A test double: a scratch directory that cannot be made, or a record that does not decode, is
// the test's failure, said at once.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

pub mod devices;
pub mod entries;
pub mod health;
pub mod host;
pub mod ledger;
pub mod mounts;
pub mod scripting;
pub mod state;
pub mod views;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::records::{Phase, StepRecord};

use crate::error::Result;
use crate::node::{
    NodeCtx, PublishCommand, StageCommand, Unobserved, UnpublishCommand, UnstageCommand,
};
use crate::request::{
    AccessMode, AccessType, Capability, FormatOptions, FsType, MountFlags, RequestPath, Roots,
    VolumeId,
};
use devices::DoubleBackend;
use host::{DoubleHost, GIB};
use ledger::MemLedger;

/// The volume most tests act on; the double sets its calls against this volume's journal.
pub const VOL: &str = "vol-a";

/// A journal line as `op/step:phase`.
pub fn line(r: &StepRecord) -> String {
    let phase = match r.phase {
        Phase::Intent => "intent",
        Phase::Done => "done",
        Phase::Failed => "failed",
    };
    format!("{}/{}:{phase}", r.op, r.step)
}

/// A node context over the double, in a temporary directory removed at drop.
pub struct Harness {
    pub dir: PathBuf,
    pub ctx: Arc<NodeCtx>,
    pub ledger: Arc<MemLedger>,
    pub host: Arc<DoubleHost>,
    pub backend: Arc<DoubleBackend>,
    roots: Roots,
}

impl Drop for Harness {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

static NEXT: AtomicU32 = AtomicU32::new(0);

/// Where the double's directories go: a tmpfs where there is one (the simulation makes and
/// removes them by the million; on ext4, after many removals, each mkdir searched the inode
/// bitmap, and directories took half the run's time), else the temp dir.
fn scratch_root() -> PathBuf {
    static ROOT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    ROOT.get_or_init(|| {
        let shm = PathBuf::from("/dev/shm");
        let probe = shm.join(format!("pipeline-probe-{}", std::process::id()));
        if std::fs::create_dir(&probe).is_ok() {
            let _ = std::fs::remove_dir(&probe);
            shm
        } else {
            std::env::temp_dir()
        }
    })
    .clone()
}

/// A node context over the double's parts with nothing in memory: no locks, no claims.
fn fresh_context(
    ledger: &Arc<MemLedger>,
    backend: &Arc<DoubleBackend>,
    host: &Arc<DoubleHost>,
    roots: &Roots,
    agent_tag: crate::node::ro_tag::AgentTag,
) -> NodeCtx {
    NodeCtx {
        ledger: Arc::clone(ledger) as _,
        backend: Arc::clone(backend) as _,
        host: Arc::clone(host) as _,
        locks: Default::default(),
        device_locks: Default::default(),
        claims: Default::default(),
        roots: roots.clone(),
        observer: Arc::new(Unobserved),
        agent_tag,
    }
}

impl Default for Harness {
    fn default() -> Self {
        Self::new()
    }
}

impl Harness {
    pub fn new() -> Harness {
        let dir = scratch_root().join(format!(
            "pipeline-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("allowed")).expect("temp dir");
        let ledger = Arc::new(MemLedger::default());
        let host = DoubleHost::new(Arc::clone(&ledger), VOL, &dir);
        let backend = Arc::new(DoubleBackend {
            host: Arc::clone(&host),
            dir: dir.clone(),
            moved: Mutex::default(),
        });
        let roots = Roots::new(vec![dir.join("allowed")], vec![dir.clone()]);
        let agent_tag = crate::node::ro_tag::AgentTag::new(1, &dir.join("state.redb"));
        let ctx = Arc::new(fresh_context(&ledger, &backend, &host, &roots, agent_tag));
        Harness {
            dir,
            ctx,
            ledger,
            host,
            backend,
            roots,
        }
    }

    /// A fresh node context over the same host, ledger and backend (nothing in memory kept:
    /// no locks, no claims): a restarted agent's, or a daemon's built over the double.
    pub fn context(&self, observer: Arc<dyn crate::node::Observer>) -> NodeCtx {
        let tag = self.ctx.agent_tag.clone();
        NodeCtx {
            observer,
            ..fresh_context(&self.ledger, &self.backend, &self.host, &self.roots, tag)
        }
    }

    /// The agent restarted (a crash: every in-memory thing lost, the host and the ledger kept):
    /// a new context over the same host, ledger and backend, its path claims reloaded from the
    /// ledger, as the daemon's start does.
    pub fn restart(&mut self, observer: Arc<dyn crate::node::Observer>) {
        let ctx = self.context(observer);
        ctx.claims.reload_tolerant(&*self.ledger);
        self.ctx = Arc::new(ctx);
    }

    /// The roots request paths must lie under: `allowed/` in the scratch directory.
    pub fn roots(&self) -> &Roots {
        &self.roots
    }

    /// Attaches a blank device of 1 GiB for `volume`.
    pub fn attach(&self, volume: &str) -> PathBuf {
        self.host.add_device(&format!("dev-{volume}"), GIB)
    }

    /// A bind of `volume`'s device node at `elsewhere` below the test's directory (an
    /// operator's, or any user's in a namespace of its own): raw use the stage must refuse.
    pub fn bind_node_elsewhere(&self, volume: &str) -> PathBuf {
        let devnum = self.host.devnum(&self.backend.device_of(volume));
        let mut bind = host::mount_facts(crate::DevNum::new(0, 5), "devtmpfs", false);
        bind.node.kind = crate::seam::FileKind::BlockDevice;
        bind.node.rdev = devnum;
        let at = self.dir.join("elsewhere");
        self.host.state().mounts.insert(at.clone(), vec![bind]);
        at
    }

    pub fn path(&self, field: &'static str, rel: &str) -> RequestPath {
        let raw = self.dir.join("allowed").join(rel);
        RequestPath::parse(field, &raw.display().to_string(), &self.roots).expect("path")
    }

    pub fn staging(&self, volume: &str) -> RequestPath {
        self.path("staging_target_path", &format!("staging/{volume}"))
    }

    pub fn target(&self, name: &str) -> RequestPath {
        self.path("target_path", &format!("pods/{name}/mount"))
    }

    pub fn stage_cmd(&self, volume: &str, capability: Capability) -> StageCommand {
        StageCommand {
            volume: VolumeId::parse(volume).expect("volume id"),
            staging: self.staging(volume),
            capability,
            publish_context: HashMap::new(),
            volume_context: HashMap::new(),
            format: FormatOptions::default(),
            deadline: Instant::now() + Duration::from_secs(5),
        }
    }

    pub fn stage(&self, cmd: &StageCommand) -> Result<()> {
        crate::node::stage(&self.ctx, cmd)
    }

    /// Stages `volume` (attached first) with an ext4 mount, SINGLE_NODE_WRITER; forgets the
    /// calls it made.
    pub fn staged(&self, volume: &str) {
        self.attach(volume);
        self.stage(&self.stage_cmd(volume, mount(AccessMode::SingleNodeWriter)))
            .expect("stage");
        self.host.state().calls.clear();
    }

    /// Stages `volume` for raw block access; forgets the calls it made.
    pub fn staged_block(&self, volume: &str, mode: AccessMode) {
        self.attach(volume);
        self.stage(&self.stage_cmd(volume, block(mode)))
            .expect("stage");
        self.host.state().calls.clear();
    }

    pub fn publish_cmd(
        &self,
        volume: &str,
        target: &str,
        capability: Capability,
    ) -> PublishCommand {
        PublishCommand {
            volume: VolumeId::parse(volume).expect("volume id"),
            staging: self.staging(volume),
            target: self.target(target),
            capability,
            readonly: false,
        }
    }

    pub fn publish(&self, cmd: &PublishCommand) -> Result<()> {
        crate::node::publish(&self.ctx, cmd)
    }

    /// Publishes staged `volume` at `target` (ext4 mount, SINGLE_NODE_WRITER); forgets the calls.
    pub fn published(&self, volume: &str, target: &str) {
        self.publish(&self.publish_cmd(volume, target, mount(AccessMode::SingleNodeWriter)))
            .expect("publish");
        self.host.state().calls.clear();
    }

    pub fn unpublish(&self, volume: &str, target: &str) -> Result<()> {
        crate::node::unpublish(
            &self.ctx,
            &UnpublishCommand {
                volume: VolumeId::parse(volume).expect("volume id"),
                target: self.target(target),
            },
        )
    }

    pub fn unstage(&self, volume: &str) -> Result<()> {
        crate::node::unstage(
            &self.ctx,
            &UnstageCommand {
                volume: VolumeId::parse(volume).expect("volume id"),
                staging: self.staging(volume),
            },
        )
    }

    /// The volume's journal lines, `op/step:phase`.
    pub fn journal(&self, volume: &str) -> Vec<String> {
        self.ledger.journal(volume).iter().map(line).collect()
    }

    /// The journal lines written from the `n`-th on.
    pub fn journal_from(&self, volume: &str, n: usize) -> Vec<String> {
        self.journal(volume).split_off(n)
    }

    /// A refusal's promise: the host was not touched, and `volume`'s journal has no line after
    /// its first `lines`.
    pub fn assert_nothing_done(&self, volume: &str, lines: usize) {
        assert_eq!(self.host.calls(), Vec::<String>::new());
        assert_eq!(self.journal_from(volume, lines), Vec::<String>::new());
    }
}

pub fn mount(mode: AccessMode) -> Capability {
    mount_with(FsType::Ext4, &[], mode)
}

pub fn mount_with(fs: FsType, flags: &[&str], mode: AccessMode) -> Capability {
    let raw: Vec<String> = flags.iter().map(|f| f.to_string()).collect();
    Capability {
        access: AccessType::Mount {
            fs,
            flags: MountFlags::parse(fs, &raw).expect("flags"),
        },
        mode,
    }
}

pub fn block(mode: AccessMode) -> Capability {
    Capability {
        access: AccessType::Block,
        mode,
    }
}

/// The node-local handle naming volume `of`'s device in the double.
pub fn handle(of: &str) -> String {
    format!("local-ebs://dev/dev-{of}")
}

/// A stage of `id` at `staging/<dir>` (a handle's id is no path component).
pub fn stage_at(h: &Harness, id: &str, dir: &str, capability: Capability) -> Result<()> {
    let mut cmd = h.stage_cmd(VOL, capability);
    cmd.volume = VolumeId::parse(id).expect("id");
    cmd.staging = h.path("staging_target_path", &format!("staging/{dir}"));
    h.stage(&cmd)
}

/// The owned strings of a list of `&str`, for comparing with `calls()` and `journal()`.
pub fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}
