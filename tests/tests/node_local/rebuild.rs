//! `recover --from-mounts` gives a node-local handle's mounts back to the handle (issue 49: a
//! fresh reviewer's F2 and M2): kubelet's layout says which id made a mount.

use ebs_tests::csi_req::*;
use ebs_tests::*;

use super::owners::{SIZE, handle_of, rwx_block, rwx_mount};

/// The handle `h` (acting for `v`) stages at `staging` and publishes at `target` with `cap`;
/// the agent stops, `recover --from-mounts` rebuilds its state, the agent starts again; then the
/// handle's own unpublish and unstage must leave nothing mounted.
async fn rebuilt_then_taken_down(
    agent: &mut Agent,
    v: Option<&Vol>,
    h: &Vol,
    staging: &std::path::Path,
    target: &std::path::Path,
    cap: csi::VolumeCapability,
    readonly: bool,
) {
    let mut node = agent.node().await;
    let mut stage = stage_req(h, staging, cap.clone());
    if let Some(v) = v {
        stage
            .publish_context
            .insert("volumeID".into(), v.id.clone());
    }
    node.node_stage_volume(stage.clone())
        .await
        .expect("stage the handle");
    node.node_publish_volume(publish_req(h, staging, target, cap, readonly))
        .await
        .expect("publish the handle");
    drop(node);
    agent.terminate().await;
    let said = agent.recover("--from-mounts");
    agent.spawn().await;
    let mut node = agent.node().await;
    node.node_unpublish_volume(unpublish_req(h, target))
        .await
        .expect("the handle's unpublish");
    node.node_unstage_volume(unstage_req(h, staging))
        .await
        .expect("the handle's unstage");
    assert_eq!(
        mounts_below(&agent.work),
        Vec::<std::path::PathBuf>::new(),
        "the handle's mounts were left: {said}"
    );
    node.node_stage_volume(stage)
        .await
        .expect("the handle staged again");
    node.node_unstage_volume(unstage_req(h, staging))
        .await
        .expect("the handle's second unstage");
}

/// kubelet's raw block layout for the handle `h` (staging and publication paths), with the
/// `vol_data.json` that names it (`…/volumeDevices/<pv>/data/`).
pub(super) fn kubelet_block_layout(
    agent: &Agent,
    h: &Vol,
) -> (std::path::PathBuf, std::path::PathBuf) {
    let devices = agent.work.join("plugins/kubernetes.io/csi/volumeDevices");
    std::fs::create_dir_all(devices.join("pv-h/data")).expect("kubelet's data dir");
    std::fs::write(
        devices.join("pv-h/data/vol_data.json"),
        format!(
            r#"{{"driverName":"ebs.csi.aws.com","volumeHandle":"{}"}}"#,
            h.id
        ),
    )
    .expect("vol_data.json");
    (
        devices.join("staging/pv-h"),
        devices.join("publish/pv-h/pod-1"),
    )
}

/// kubelet's staging directory for `handle`: named after its SHA-256.
fn kubelet_staging(agent: &Agent, handle: &str) -> std::path::PathBuf {
    let sha = sh(&format!("printf %s '{handle}' | sha256sum"));
    let sha = String::from_utf8_lossy(&sha.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string();
    agent.work.join(format!(
        "plugins/kubernetes.io/csi/ebs.csi.aws.com/{sha}/globalmount"
    ))
}

/// `recover --from-mounts` gives a node-local handle's mounts back to the handle, not to the
/// volume its device proves to be: kubelet names the staging directory after the handle's
/// SHA-256, and kubelet's later NodeUnpublish and NodeUnstage name the handle.
#[tokio::test]
async fn recover_from_mounts_gives_a_handles_mounts_back_to_the_handle() {
    let _shared = crate::NAMESPACE_COPY.read().await;
    if !require_root("recover_from_mounts_gives_a_handles_mounts_back_to_the_handle") {
        return;
    }
    let scratch = Scratch::new("node-local-rebuild");
    let mut agent = Agent::start(&scratch, AgentOpts::default()).await;
    let v = create_attached(&agent, "v", SIZE).await;
    let h = handle_of(&v);
    let staging = kubelet_staging(&agent, &h.id);
    let target = agent.work.join("pods/p/volumes/kubernetes.io~csi/pv/mount");
    rebuilt_then_taken_down(
        &mut agent,
        Some(&v),
        &h,
        &staging,
        &target,
        rwx_mount(),
        false,
    )
    .await;
}

/// The same for a handle naming a device that is none of the agent's volumes (an operator's
/// disk): `recover --from-mounts` looked only at its volumes' devices, so the handle's mounts
/// were left with no record, its unpublish and unstage answered OK and left them, and every
/// later stage of it was refused (a thirty-first fresh review's F1).
#[tokio::test]
async fn recover_from_mounts_gives_a_handle_on_an_operators_disk_its_mounts_back() {
    let _shared = crate::NAMESPACE_COPY.read().await;
    if !require_root("recover_from_mounts_gives_a_handle_on_an_operators_disk_its_mounts_back") {
        return;
    }
    let scratch = Scratch::new("node-local-rebuild-disk");
    let mut agent = Agent::start(&scratch, AgentOpts::default()).await;
    let disk = crate::Disk::new(&scratch, "operators", SIZE as u64);
    let h = handle_of(&disk.vol());
    let staging = kubelet_staging(&agent, &h.id);
    let target = agent.work.join("pods/p/volumes/kubernetes.io~csi/pv/mount");
    rebuilt_then_taken_down(&mut agent, None, &h, &staging, &target, rwx_mount(), false).await;
}

/// The same for a raw block handle, whose mounts carry no handle in their names: kubelet's own
/// `vol_data.json` for the volume (`…/volumeDevices/<pv>/data/`) says which handle it used.
#[tokio::test]
async fn recover_from_mounts_gives_a_raw_block_handles_binds_back_to_the_handle() {
    let _shared = crate::NAMESPACE_COPY.read().await;
    if !require_root("recover_from_mounts_gives_a_raw_block_handles_binds_back_to_the_handle") {
        return;
    }
    let scratch = Scratch::new("node-local-rebuild-block");
    let mut agent = Agent::start(&scratch, AgentOpts::default()).await;
    let v = create_attached(&agent, "v", SIZE).await;
    let h = handle_of(&v);
    let (staging, target) = kubelet_block_layout(&agent, &h);
    rebuilt_then_taken_down(
        &mut agent,
        Some(&v),
        &h,
        &staging,
        &target,
        rwx_block(),
        false,
    )
    .await;
}

/// After `recover --reset` the loop volumes' records are gone, but their files are still the
/// agent's: a hard link of one made outside the state directory, laid on a loop device by an
/// operator, is never a handle's (a ninth fresh review's F5: the handle read the volume's
/// files, the check having compared the kernel's path string with the state directory).
#[tokio::test]
async fn a_hard_link_of_a_volumes_file_is_the_agents_after_a_reset() {
    let _shared = crate::NAMESPACE_COPY.read().await;
    if !require_root("a_hard_link_of_a_volumes_file_is_the_agents_after_a_reset") {
        return;
    }
    let scratch = Scratch::new("node-local-link");
    let mut agent = Agent::start(&scratch, AgentOpts::default()).await;
    let v = create_attached(&agent, "v", SIZE).await;
    let name = v.device.trim_start_matches("/dev/");
    let file = std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file"))
        .expect("the volume's file");
    agent.terminate().await;
    agent.recover("--reset");
    agent.spawn().await;
    let link = scratch.join("link.img");
    std::fs::hard_link(file.trim(), &link).expect("a hard link of the volume's file");
    let laid = super::losetup("", link.display());
    let _laid = super::owners::DetachOnDrop(laid.clone());
    let h = Vol {
        id: format!("local-ebs://{}", laid.trim_start_matches('/')),
        device: laid,
    };
    let e = agent
        .node()
        .await
        .node_stage_volume(stage_req(&h, &agent.work.join("h/staging"), rwx_mount()))
        .await
        .expect_err("a handle took a volume's file through a hard link");
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
}

/// A read-only raw block publication of such a handle binds this agent's read-only device laid
/// over the handle's disk: rebuilt under the handle, read-only (a thirty-second fresh review's
/// F3: no record was made, the unpublish answered OK and left the bind, the handle was refused
/// for good).
#[tokio::test]
async fn recover_from_mounts_gives_a_handles_read_only_raw_publication_back() {
    let _shared = crate::NAMESPACE_COPY.read().await;
    if !require_root("recover_from_mounts_gives_a_handles_read_only_raw_publication_back") {
        return;
    }
    let scratch = Scratch::new("node-local-rebuild-ro");
    let mut agent = Agent::start(&scratch, AgentOpts::default()).await;
    let disk = crate::Disk::new(&scratch, "operators", SIZE as u64);
    let h = handle_of(&disk.vol());
    let (staging, target) = kubelet_block_layout(&agent, &h);
    // On a failure: the bind first, then the read-only device over the disk, then the disk.
    let _overlays = super::owners::OverlaysOver(disk.dev.display().to_string());
    let _unbind = Unmount(target.clone());
    rebuilt_then_taken_down(&mut agent, None, &h, &staging, &target, rwx_block(), true).await;
}
