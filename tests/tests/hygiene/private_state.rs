//! The agent's state is private: its directory 0700, the state file and every volume image
//! (created, snapshot, clone) 0600, whatever the umask and whatever modes were there before.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use ebs_tests::csi_req::*;
use ebs_tests::*;

use super::{MIB, fs_cap, modes_below};

/// Sets the umask for as long as it lives (the agent inherits it when spawned meanwhile).
struct Umask(nix::sys::stat::Mode);

impl Umask {
    fn set(mask: u32) -> Umask {
        let mode = nix::sys::stat::Mode::from_bits_truncate(mask as _);
        Umask(nix::sys::stat::umask(mode))
    }
}

impl Drop for Umask {
    fn drop(&mut self) {
        nix::sys::stat::umask(self.0);
    }
}

/// Whether user `nobody` can read the first byte of `file`.
fn nobody_reads(file: &Path) -> bool {
    Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "head",
            "-c1",
        ])
        .arg(file)
        .output()
        .expect("setpriv")
        .status
        .success()
}

fn set_mode(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

#[tokio::test]
async fn state_is_private_whatever_the_umask_and_the_modes_left_before() {
    if !require_root("state_is_private_whatever_the_umask_and_the_modes_left_before") {
        return;
    }
    let scratch = Scratch::new("private-state");
    // The scratch directory itself is open to all, as /var/lib is.
    set_mode(&scratch.path, 0o755);
    let mut agent = Agent::unstarted(&scratch, AgentOpts::default());
    let state = agent.state_dir.clone();

    // A first agent, started with umask 0, makes a volume, a snapshot and a clone.
    let (images, vol) = {
        let _mask = Umask::set(0);
        agent.spawn().await;
        let vol = create_attached(&agent, "private", 64 * MIB).await;
        let staging = agent.work.join("stage-private");
        let mut node = agent.node().await;
        node.node_stage_volume(stage_req(&vol, &staging, fs_cap()))
            .await
            .expect("stage");
        std::fs::write(staging.join("secret"), "only root may read this").expect("write");
        set_mode(&staging.join("secret"), 0o600);
        node.node_unstage_volume(unstage_req(&vol, &staging))
            .await
            .expect("unstage");
        let mut c = agent.controller().await;
        let snap = c
            .create_snapshot(csi::CreateSnapshotRequest {
                source_volume_id: vol.id.clone(),
                name: "private-snap".into(),
                ..Default::default()
            })
            .await
            .expect("snapshot")
            .into_inner()
            .snapshot
            .expect("snapshot");
        let clone = c
            .create_volume(csi::CreateVolumeRequest {
                name: "private-clone".into(),
                capacity_range: at_least(64 * MIB),
                volume_capabilities: vec![fs_cap()],
                volume_content_source: Some(csi::VolumeContentSource {
                    r#type: Some(csi::volume_content_source::Type::Snapshot(
                        csi::volume_content_source::SnapshotSource {
                            snapshot_id: snap.snapshot_id,
                        },
                    )),
                }),
                ..Default::default()
            })
            .await
            .expect("clone")
            .into_inner()
            .volume
            .expect("volume");
        attach(&agent, &clone.volume_id).await;
        let images: Vec<_> = modes_below(&state)
            .into_iter()
            .filter(|(p, _)| p.extension().is_some_and(|e| e == "img"))
            .collect();
        (images, vol)
    };
    assert!(
        images.len() >= 3,
        "a volume, a snapshot, a clone: {images:?}"
    );
    let loose: Vec<_> = modes_below(&state)
        .into_iter()
        .filter(|(p, mode)| (p.is_dir() && *mode != 0o700) || (p.is_file() && *mode != 0o600))
        .collect();
    assert!(loose.is_empty(), "created under umask 0: {loose:?}");
    let image = &images[0].0;
    assert!(!nobody_reads(image), "nobody read {}", image.display());
    assert!(!nobody_reads(&state.join("state.redb")));

    // Modes loosened while it was stopped (an older agent, a hostPath made 0755) are
    // tightened at the next start, each with a log line.
    agent.terminate().await;
    for (path, _) in modes_below(&state) {
        set_mode(&path, if path.is_dir() { 0o755 } else { 0o644 });
    }
    assert!(nobody_reads(image), "the test's own loosening did not take");
    agent.spawn().await;
    let loose: Vec<_> = modes_below(&state)
        .into_iter()
        .filter(|(p, mode)| (p.is_dir() && *mode != 0o700) || (p.is_file() && *mode != 0o600))
        .collect();
    assert!(loose.is_empty(), "after a restart: {loose:?}");
    assert!(!nobody_reads(image));
    let log = agent.log_text();
    let said = log.lines().filter(|l| l.contains("private state")).count();
    assert!(
        said >= images.len() + 3,
        "one line per thing tightened:\n{log}"
    );
    // The volume still stages as before.
    let staging = agent.work.join("stage-private-2");
    agent
        .node()
        .await
        .node_stage_volume(stage_req(&vol, &staging, fs_cap()))
        .await
        .expect("stage after the restart");
    assert_eq!(
        std::fs::read_to_string(staging.join("secret")).expect("read"),
        "only root may read this"
    );
}
