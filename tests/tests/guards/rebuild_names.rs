//! `recover --from-mounts` knows a bind of a device node by the numbers of the node bound there,
//! never by the name of the bind's root (a sixteenth fresh review's F2): a tmpfs directory named
//! like a volume's device (kubelet's subPath of a memory emptyDir), bound elsewhere, is nobody's
//! publication, so it never keeps the volume from being detached.

use ebs_tests::csi_req::*;
use ebs_tests::*;

use csi::volume_capability::access_mode::Mode;

use super::MIB;

/// Unmounts, on drop, what the test mounted (the bind first).
struct Mounts(Vec<std::path::PathBuf>);

impl Drop for Mounts {
    fn drop(&mut self) {
        for m in &self.0 {
            let _ = std::process::Command::new("umount").arg(m).status();
        }
    }
}

#[tokio::test]
async fn a_tmpfs_directory_named_like_a_device_is_no_publication() {
    let _ns = crate::NAMESPACE_COPY.read().await;
    if !require_root("a_tmpfs_directory_named_like_a_device_is_no_publication") {
        return;
    }
    let scratch = Scratch::new("g-rebuild-names");
    let mut agent = Agent::start(&scratch, AgentOpts::default()).await;
    let vol = create_attached(&agent, "n", 64 * MIB).await;
    let staging = agent.work.join("staging/n");
    agent
        .node()
        .await
        .node_stage_volume(stage_req(
            &vol,
            &staging,
            mount_cap("ext4", Mode::SingleNodeWriter),
        ))
        .await
        .expect("stage");
    let (tm, fake) = (scratch.join("tm"), agent.work.join("fake"));
    std::fs::create_dir_all(&tm).expect("tmpfs mount point");
    std::fs::create_dir_all(&fake).expect("bind target");
    let name = vol.device.trim_start_matches("/dev/");
    sh(&format!("mount -t tmpfs t {}", tm.display()));
    let mut mounts = Mounts(vec![tm.clone()]);
    std::fs::create_dir(tm.join(name)).expect("a directory named like the device");
    sh(&format!(
        "mount --bind {} {}",
        tm.join(name).display(),
        fake.display()
    ));
    mounts.0.insert(0, fake.clone());
    agent.terminate().await;
    let said = agent.recover("--from-mounts");
    assert!(
        !said.contains(&fake.display().to_string()),
        "a tmpfs directory became a publication: {said}"
    );
    agent.spawn().await;
    agent
        .node()
        .await
        .node_unstage_volume(unstage_req(&vol, &staging))
        .await
        .expect("unstage");
    drop(mounts);
}

/// `recover --from-mounts` rebuilds a loop volume's attachment on the device its live mounts are
/// on, not on an operator's unmounted second device over its file that happens to have a lower
/// number (a seventeenth fresh review's F2: the volume's mounts were dropped from the records and
/// ControllerUnpublish then detached the operator's device).
#[tokio::test]
async fn a_rebuilt_attachment_is_the_device_the_volume_is_mounted_from() {
    // Alone: a number freed here must not go to another test's `losetup -f` before it is bound.
    let _alone = crate::NAMESPACE_COPY.write().await;
    if !require_root("a_rebuilt_attachment_is_the_device_the_volume_is_mounted_from") {
        return;
    }
    let scratch = Scratch::new("g-rebuild-pick");
    let mut agent = Agent::start(&scratch, AgentOpts::default()).await;
    let dummy_file = scratch.join("dummy.img");
    sh(&format!("truncate -s 1M {}", dummy_file.display()));
    let dummy =
        String::from_utf8_lossy(&sh(&format!("losetup -f --show {}", dummy_file.display())).stdout)
            .trim()
            .to_string();
    let vol = create_attached(&agent, "c", 64 * MIB).await;
    let staging = agent.work.join("staging/c");
    agent
        .node()
        .await
        .node_stage_volume(stage_req(
            &vol,
            &staging,
            mount_cap("ext4", Mode::SingleNodeWriter),
        ))
        .await
        .expect("stage");
    detach_loop(std::path::Path::new(&dummy));
    let file = agent.state_dir.join(format!("volumes/{}.img", vol.id));
    rebind_loop(&dummy, &file);
    let _operators = Detach(dummy.clone());
    agent.terminate().await;
    agent.recover("--from-mounts");
    agent.spawn().await;
    agent
        .node()
        .await
        .node_unstage_volume(unstage_req(&vol, &staging))
        .await
        .expect("unstage");
    assert!(
        !super::is_mounted(&staging),
        "the volume's staging was dropped from the records"
    );
    agent
        .controller()
        .await
        .controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
            volume_id: vol.id.clone(),
            node_id: node_id(&agent).await,
            ..Default::default()
        })
        .await
        .expect("controller unpublish");
    let name = dummy.trim_start_matches("/dev/");
    assert!(
        std::path::Path::new(&format!("/sys/block/{name}/loop")).exists(),
        "the operator's device was detached"
    );
}

/// Detaches a loop device the test made, on drop.
struct Detach(String);

impl Drop for Detach {
    fn drop(&mut self) {
        detach_loop(std::path::Path::new(&self.0));
    }
}

/// The same, with the operator's second device over the file mounted too (read-only, outside
/// every allowed prefix) and listed first: the device the agent attached carries the agent's
/// name, and that is the attachment (a twenty-eighth fresh review's F1: the operator's mount
/// became the volume's staging, the real one was dropped, and DeleteVolume stayed refused).
#[tokio::test]
async fn a_rebuilt_attachment_is_the_agents_own_device_when_a_view_is_mounted_too() {
    let _alone = crate::NAMESPACE_COPY.write().await;
    if !require_root("a_rebuilt_attachment_is_the_agents_own_device_when_a_view_is_mounted_too") {
        return;
    }
    let scratch = Scratch::new("g-rebuild-named");
    let mut agent = Agent::start(&scratch, AgentOpts::default()).await;
    let dummy_file = scratch.join("dummy.img");
    sh(&format!("truncate -s 1M {}", dummy_file.display()));
    let dummy =
        String::from_utf8_lossy(&sh(&format!("losetup -f --show {}", dummy_file.display())).stdout)
            .trim()
            .to_string();
    let vol = create_attached(&agent, "n", 64 * MIB).await;
    let staging = agent.work.join("staging/n");
    agent
        .node()
        .await
        .node_stage_volume(stage_req(
            &vol,
            &staging,
            mount_cap("ext4", Mode::SingleNodeWriter),
        ))
        .await
        .expect("stage");
    detach_loop(std::path::Path::new(&dummy));
    let file = agent.state_dir.join(format!("volumes/{}.img", vol.id));
    sh(&format!("losetup -r {dummy} {}", file.display()));
    let _operators = Detach(dummy.clone());
    let at = scratch.join("operators-view");
    std::fs::create_dir_all(&at).expect("mount point");
    sh(&format!("mount -o ro,noload {dummy} {}", at.display()));
    let _viewed = Unmount(at);
    agent.terminate().await;
    agent.recover("--from-mounts");
    agent.spawn().await;
    agent
        .node()
        .await
        .node_unstage_volume(unstage_req(&vol, &staging))
        .await
        .expect("unstage");
    assert!(
        !super::is_mounted(&staging),
        "the staging was not the volume's any more"
    );
    agent
        .controller()
        .await
        .controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
            volume_id: vol.id.clone(),
            node_id: node_id(&agent).await,
            ..Default::default()
        })
        .await
        .expect("controller unpublish after the rebuild");
}
