//! The loop backend as a complete local driver, on real loop devices: snapshots and restores,
//! clones, their independence from the source, the attach limit and read-only attachments.

use std::path::{Path, PathBuf};

use ebs_tests::csi::volume_capability::access_mode::Mode;
use ebs_tests::csi_req::*;
use ebs_tests::*;
use tonic::Code;

mod freezes;
mod making;

const MIB: i64 = 1 << 20;

fn code<T>(r: Result<T, tonic::Status>) -> Code {
    match r {
        Ok(_) => Code::Ok,
        Err(s) => s.code(),
    }
}

fn ext4() -> csi::VolumeCapability {
    mount_cap("ext4", Mode::SingleNodeWriter)
}

/// Attaches, stages and publishes a volume; returns it and its target path.
async fn mount(agent: &Agent, id: &str, tag: &str) -> (Vol, PathBuf, PathBuf) {
    let vol = attach(agent, id).await;
    let staging = agent.work.join(format!("{tag}/staging"));
    let target = agent.work.join(format!("{tag}/target"));
    let mut node = agent.node().await;
    node.node_stage_volume(stage_req(&vol, &staging, ext4()))
        .await
        .expect("stage");
    node.node_publish_volume(publish_req(&vol, &staging, &target, ext4(), false))
        .await
        .expect("publish");
    (vol, staging, target)
}

async fn unmount(agent: &Agent, vol: &Vol, staging: &Path, target: &Path) {
    unpublish_and_unstage(agent, vol, staging, target).await;
    let node_id = node_id(agent).await;
    agent
        .controller()
        .await
        .controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
            volume_id: vol.id.clone(),
            node_id,
            ..Default::default()
        })
        .await
        .expect("detach");
}

async fn snapshot(agent: &Agent, name: &str, volume: &str) -> csi::Snapshot {
    agent
        .controller()
        .await
        .create_snapshot(csi::CreateSnapshotRequest {
            source_volume_id: volume.into(),
            name: name.into(),
            ..Default::default()
        })
        .await
        .expect("snapshot")
        .into_inner()
        .snapshot
        .expect("snapshot in the answer")
}

fn from_source(
    name: &str,
    bytes: i64,
    source: csi::volume_content_source::Type,
) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        name: name.into(),
        capacity_range: at_least(bytes),
        volume_capabilities: vec![ext4()],
        volume_content_source: Some(csi::VolumeContentSource {
            r#type: Some(source),
        }),
        ..Default::default()
    }
}

fn of_snapshot(id: &str) -> csi::volume_content_source::Type {
    csi::volume_content_source::Type::Snapshot(csi::volume_content_source::SnapshotSource {
        snapshot_id: id.into(),
    })
}

fn of_volume(id: &str) -> csi::volume_content_source::Type {
    csi::volume_content_source::Type::Volume(csi::volume_content_source::VolumeSource {
        volume_id: id.into(),
    })
}

async fn create_from(agent: &Agent, req: csi::CreateVolumeRequest) -> csi::Volume {
    agent
        .controller()
        .await
        .create_volume(req)
        .await
        .expect("create from a source")
        .into_inner()
        .volume
        .expect("volume")
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[tokio::test]
async fn snapshots_restores_and_clones_hold_the_data_and_outlive_their_source() {
    let test = "snapshots_restores_and_clones_hold_the_data_and_outlive_their_source";
    if !require_root(test) {
        return;
    }
    let scratch = Scratch::new("loop-copies");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let src = create_volume(&agent, "source", 32 * MIB, &[]).await;
    let (src_vol, src_staging, src_target) = mount(&agent, &src, "src").await;
    std::fs::write(src_target.join("data"), "before the snapshot").expect("write");

    // Taken while the volume is mounted and written to: its filesystem is frozen for the copy,
    // so what was written before is in it even though nothing synced.
    let snap = snapshot(&agent, "snap-1", &src).await;
    assert!(snap.ready_to_use && snap.size_bytes == 32 * MIB, "{snap:?}");
    assert!(
        agent.log_text().contains("frozen=true"),
        "the copy froze the mounted filesystem"
    );
    std::fs::write(src_target.join("data"), "after the snapshot").expect("write");
    let clone = create_from(&agent, from_source("clone", 32 * MIB, of_volume(&src))).await;
    assert!(matches!(
        clone.content_source.as_ref().and_then(|s| s.r#type.as_ref()),
        Some(csi::volume_content_source::Type::Volume(v)) if v.volume_id == src
    ));

    // Restoring and cloning into less than the source is OUT_OF_RANGE; an unknown source is
    // NOT_FOUND.
    let mut c = agent.controller().await;
    let mut small = from_source("small", 16 * MIB, of_snapshot(&snap.snapshot_id));
    small.capacity_range = Some(csi::CapacityRange {
        required_bytes: 16 * MIB,
        limit_bytes: 16 * MIB,
    });
    assert_eq!(code(c.create_volume(small).await), Code::OutOfRange);
    let unknown = from_source("unknown", 32 * MIB, of_snapshot("snap-0000000000000000"));
    assert_eq!(code(c.create_volume(unknown).await), Code::NotFound);

    // Deleting a volume that has snapshots is allowed: snapshots are copies.
    unmount(&agent, &src_vol, &src_staging, &src_target).await;
    c.delete_volume(csi::DeleteVolumeRequest {
        volume_id: src.clone(),
        ..Default::default()
    })
    .await
    .expect("delete the source");
    let listed = c
        .list_snapshots(csi::ListSnapshotsRequest {
            source_volume_id: src.clone(),
            ..Default::default()
        })
        .await
        .expect("list")
        .into_inner();
    assert_eq!(listed.entries.len(), 1, "the snapshot outlives its volume");

    // Restored after the source is gone, bigger than the source.
    let restored = create_from(
        &agent,
        from_source("restored", 48 * MIB, of_snapshot(&snap.snapshot_id)),
    )
    .await;
    assert_eq!(restored.capacity_bytes, 48 * MIB);
    c.delete_snapshot(csi::DeleteSnapshotRequest {
        snapshot_id: snap.snapshot_id.clone(),
        ..Default::default()
    })
    .await
    .expect("delete the snapshot");

    let (r_vol, r_staging, r_target) = mount(&agent, &restored.volume_id, "restored").await;
    assert_eq!(read(&r_target.join("data")), "before the snapshot");
    let (c_vol, c_staging, c_target) = mount(&agent, &clone.volume_id, "clone").await;
    assert_eq!(read(&c_target.join("data")), "after the snapshot");
    // The copies are volumes of their own.
    std::fs::write(c_target.join("data"), "the clone's own").expect("write clone");
    assert_eq!(read(&r_target.join("data")), "before the snapshot");
    unmount(&agent, &r_vol, &r_staging, &r_target).await;
    unmount(&agent, &c_vol, &c_staging, &c_target).await;
}

#[tokio::test]
async fn raw_block_snapshot_is_the_devices_bytes() {
    let test = "raw_block_snapshot_is_the_devices_bytes";
    if !require_root(test) {
        return;
    }
    let scratch = Scratch::new("loop-block-copy");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let vol = create_attached(&agent, "raw", 8 * MIB).await;
    // Written through the attached device (its page cache), not the file: the snapshot must
    // flush the device first.
    let pattern: Vec<u8> = (0..(2 * MIB) as usize)
        .map(|i| (i * 7 % 251) as u8)
        .collect();
    {
        use std::io::{Seek, Write};
        let mut dev = std::fs::OpenOptions::new()
            .write(true)
            .open(&vol.device)
            .expect("open the device");
        dev.seek(std::io::SeekFrom::Start(MIB as u64))
            .expect("seek");
        dev.write_all(&pattern).expect("write the device");
    }
    let snap = snapshot(&agent, "raw-snap", &vol.id).await;
    let restored = create_from(
        &agent,
        from_source("raw-restored", 8 * MIB, of_snapshot(&snap.snapshot_id)),
    )
    .await;
    let copy = attach(&agent, &restored.volume_id).await;
    assert_eq!(
        checksum(Path::new(&copy.device)),
        checksum(Path::new(&vol.device))
    );
}

#[tokio::test]
async fn attach_limit_and_read_only_attachments() {
    let test = "attach_limit_and_read_only_attachments";
    if !require_root(test) {
        return;
    }
    let scratch = Scratch::new("loop-attach-limit");
    let mut opts = AgentOpts::default();
    opts.args
        .extend(["--volume-attach-limit".into(), "2".into()]);
    let agent = Agent::start(&scratch, opts).await;
    let info = agent
        .node()
        .await
        .node_get_info(csi::NodeGetInfoRequest {})
        .await
        .expect("node info")
        .into_inner();
    assert_eq!(
        info.max_volumes_per_node, 2,
        "NodeGetInfo advertises the limit"
    );

    let a = create_attached(&agent, "a", 8 * MIB).await;
    let b = create_volume(&agent, "b", 8 * MIB, &[]).await;
    let c = create_volume(&agent, "c", 8 * MIB, &[]).await;
    let mut ctl = agent.controller().await;
    let publish = |id: &str, readonly: bool| csi::ControllerPublishVolumeRequest {
        volume_id: id.into(),
        node_id: info.node_id.clone(),
        volume_capability: Some(ext4()),
        readonly,
        ..Default::default()
    };
    let ro = ctl
        .controller_publish_volume(publish(&b, true))
        .await
        .expect("read-only attach")
        .into_inner();
    let device = &ro.publish_context["devicePath"];
    let name = Path::new(device)
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    assert_eq!(
        read(&Path::new("/sys/block").join(name).join("ro")).trim(),
        "1"
    );
    // Already attached, but read-write asked: incompatible.
    assert_eq!(
        code(ctl.controller_publish_volume(publish(&b, false)).await),
        Code::AlreadyExists
    );
    // The same attachment again is fine, even at the limit.
    ctl.controller_publish_volume(publish(&b, true))
        .await
        .expect("idempotent");
    ctl.controller_publish_volume(publish(&a.id, false))
        .await
        .expect("idempotent");
    assert_eq!(
        code(ctl.controller_publish_volume(publish(&c, false)).await),
        Code::ResourceExhausted
    );
    ctl.controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
        volume_id: a.id.clone(),
        node_id: info.node_id.clone(),
        ..Default::default()
    })
    .await
    .expect("detach");
    ctl.controller_publish_volume(publish(&c, false))
        .await
        .expect("room again");
}

#[tokio::test]
async fn an_xfs_clone_mounts_beside_its_source() {
    let test = "an_xfs_clone_mounts_beside_its_source";
    if !require_root(test) {
        return;
    }
    let scratch = Scratch::new("loop-xfs-clone");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let xfs = || mount_cap("xfs", Mode::SingleNodeWriter);
    let src = attach(
        &agent,
        &create_volume(&agent, "xfs-src", 320 * MIB, &[]).await,
    )
    .await;
    let staging = agent.work.join("xfs-src");
    let mut node = agent.node().await;
    node.node_stage_volume(stage_req(&src, &staging, xfs()))
        .await
        .expect("stage the source");
    std::fs::write(staging.join("data"), "xfs").expect("write");
    let clone = create_from(
        &agent,
        from_source("xfs-clone", 320 * MIB, of_volume(&src.id)),
    )
    .await;
    let copy = attach(&agent, &clone.volume_id).await;
    let copy_staging = agent.work.join("xfs-clone");
    node.node_stage_volume(stage_req(&copy, &copy_staging, xfs()))
        .await
        .expect("stage the clone while its source is mounted");
    // Same filesystem UUID as the source: the node mounts XFS with nouuid, so both mount.
    assert_eq!(read(&copy_staging.join("data")), "xfs");
}
