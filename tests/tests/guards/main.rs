//! Issue 31: promises that still broke. Each test reproduces one way, on real loop devices and
//! the real binary: the loop controller racing a stage (item 2), a read-only raw block
//! publication that was writable (item 5), a v0.1 retry removing the first call's staging
//! directory (item 8), `ro` among the mount flags (item 9), a CreateVolume retry after a failed
//! sizing (item 10). Issue 49: read-only raw block devices kept through a rebuilt or reset
//! state and through another agent's start, and following a resize (`ro_recovery`, `ro_resize`).

mod adopted;
mod adopted_block;
mod adopted_copies;
mod adopted_found;
mod bound_elsewhere;
mod create_retry;
mod kept_flags;
mod nodev;
mod races;
mod rebuild_names;
mod rebuild_ro;
mod ro_block;
mod ro_block_views;
mod ro_flags;
mod ro_peer;
mod ro_recovery;
mod ro_resize;
mod ro_tags;
mod v01_retry;

use std::path::Path;

use ebs_tests::*;

pub const MIB: i64 = 1 << 20;

/// A new mount namespace copies every mount there is, the other tests' too, and until its copies
/// are gone a parallel test's unstage is rightly refused as "still mounted elsewhere". So the
/// tests that make one hold this alone, every other test of the binary holds it shared (as
/// `node_local` does).
pub static NAMESPACE_COPY: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// Whether anything is mounted exactly at `path`.
pub fn is_mounted(path: &Path) -> bool {
    mounts_below(path).iter().any(|m| m == path)
}

/// The backing file of a loop device as sysfs shows it ("" when it is not attached).
pub fn backing_file(device: &str) -> String {
    let name = device.trim_start_matches("/dev/");
    std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file"))
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// An open of `path` for writing and a write of one block fail (EROFS, EPERM or EACCES).
pub fn write_fails(path: &Path) -> Result<(), String> {
    use std::io::Write;
    let opened = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path);
    match opened {
        Err(e) => match e.raw_os_error() {
            Some(libc::EROFS | libc::EPERM | libc::EACCES) => Ok(()),
            _ => Err(format!("open for writing failed otherwise: {e}")),
        },
        Ok(mut f) => match f.write_all(&[0xAB; 4096]).and_then(|()| f.sync_all()) {
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EROFS | libc::EPERM | libc::EACCES)
                ) =>
            {
                Ok(())
            }
            Err(e) => Err(format!("the write failed otherwise: {e}")),
            Ok(()) => Err(format!("{} was writable", path.display())),
        },
    }
}

/// A volume of `bytes`, attached and staged with `cap` at `staging/<name>`: the volume and its
/// staging path.
pub async fn staged(
    agent: &Agent,
    name: &str,
    bytes: i64,
    cap: ebs_tests::csi::VolumeCapability,
) -> (ebs_tests::csi_req::Vol, std::path::PathBuf) {
    use ebs_tests::csi_req::{create_attached, stage_req};
    let v = create_attached(agent, name, bytes).await;
    let staging = agent.work.join(format!("staging/{name}"));
    agent
        .node()
        .await
        .node_stage_volume(stage_req(&v, &staging, cap))
        .await
        .expect("stage");
    (v, staging)
}

/// A publish of `req` cut by a crash right after its durable bind intent: the agent restarted
/// with that crash point, the publish sent, and the agent's exit waited for (it is down after).
pub async fn cut_past_bind_intent(agent: &mut Agent, req: csi::NodePublishVolumeRequest) {
    use ebs_tests::crash_points::{self as cp, Op as J, Step as S};
    let mut opts = AgentOpts::default();
    opts.args
        .extend(["--crash-after".into(), cp::intent(J::Publish, S::Bind)]);
    agent.restart(Some(opts)).await;
    let mut node = agent.node().await;
    assert!(node.node_publish_volume(req).await.is_err());
    agent
        .wait_exit(std::time::Duration::from_secs(20))
        .await
        .expect("crashed");
}
