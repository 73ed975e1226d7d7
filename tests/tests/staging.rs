//! The staging pipeline on real loop devices: lifecycle, idempotency, block access, concurrency.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

use ebs_tests::csi_req::*;
use ebs_tests::*;

use csi::volume_capability::access_mode::Mode;
use tonic::Code;

fn mounts_under(dir: &Path) -> Vec<String> {
    let mut m: Vec<String> = mounts_below(dir)
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    m.sort();
    m
}

async fn lifecycle(fs: &str) {
    let scratch = Scratch::new(&format!("life-{fs}"));
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let vol = create_attached(&agent, &format!("life-{fs}"), 512 << 20).await;
    let staging = agent.work.join("staging/life");
    let target = agent.work.join("pods/p1/mount");
    let cap = mount_cap(fs, Mode::SingleNodeWriter);
    let mut node = agent.node().await;

    node.node_stage_volume(stage_req(&vol, &staging, cap.clone()))
        .await
        .unwrap();
    let uuid = fs_uuid(&vol.device);
    assert!(!uuid.is_empty(), "formatted with a UUID");
    node.node_publish_volume(publish_req(&vol, &staging, &target, cap.clone(), false))
        .await
        .unwrap();
    std::fs::write(target.join("data.txt"), b"precious bytes").unwrap();
    node.node_unpublish_volume(unpublish_req(&vol, &target))
        .await
        .unwrap();
    assert!(!target.exists(), "unpublish removes the target it created");
    node.node_unstage_volume(unstage_req(&vol, &staging))
        .await
        .unwrap();
    assert!(mounts_under(&scratch.path).is_empty());

    // Stage again: no format, same UUID, data intact.
    node.node_stage_volume(stage_req(&vol, &staging, cap.clone()))
        .await
        .unwrap();
    assert_eq!(fs_uuid(&vol.device), uuid, "stage again must not format");
    node.node_publish_volume(publish_req(&vol, &staging, &target, cap.clone(), true))
        .await
        .unwrap();
    assert_eq!(
        std::fs::read(target.join("data.txt")).unwrap(),
        b"precious bytes"
    );
    let err = std::fs::write(target.join("new.txt"), b"x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS), "read-only publish");
    node.node_unpublish_volume(unpublish_req(&vol, &target))
        .await
        .unwrap();
    node.node_unstage_volume(unstage_req(&vol, &staging))
        .await
        .unwrap();
    let journal = agent.log_text();
    assert_eq!(
        journal.matches("formatted").count(),
        1,
        "exactly one format"
    );
}

#[tokio::test]
async fn lifecycle_ext4() {
    if require_root("lifecycle_ext4") {
        lifecycle("ext4").await;
    }
}

#[tokio::test]
async fn lifecycle_xfs() {
    if require_root("lifecycle_xfs") {
        lifecycle("xfs").await;
    }
}

#[tokio::test]
async fn block_publish_reads_and_writes_raw_bytes() {
    if !require_root("block_publish_reads_and_writes_raw_bytes") {
        return;
    }
    let scratch = Scratch::new("block");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let vol = create_attached(&agent, "blk", 16 << 20).await;
    let staging = agent.work.join("staging/blk");
    let target = agent.work.join("pods/p1/dev");
    std::fs::create_dir_all(target.parent().unwrap()).unwrap();
    let cap = block_cap(Mode::SingleNodeWriter);
    let mut node = agent.node().await;
    node.node_stage_volume(stage_req(&vol, &staging, cap.clone()))
        .await
        .unwrap();
    node.node_publish_volume(publish_req(&vol, &staging, &target, cap.clone(), false))
        .await
        .unwrap();
    {
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&target)
            .unwrap();
        f.seek(SeekFrom::Start(4096)).unwrap();
        f.write_all(b"raw block bytes").unwrap();
        f.sync_all().unwrap();
    }
    let mut dev = std::fs::File::open(&vol.device).unwrap();
    dev.seek(SeekFrom::Start(4096)).unwrap();
    let mut buf = [0u8; 15];
    dev.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"raw block bytes");
    assert_eq!(fs_uuid(&vol.device), "", "block access never formats");
    // Twice: same answer.
    node.node_publish_volume(publish_req(&vol, &staging, &target, cap.clone(), false))
        .await
        .unwrap();
    node.node_unpublish_volume(unpublish_req(&vol, &target))
        .await
        .unwrap();
    node.node_unpublish_volume(unpublish_req(&vol, &target))
        .await
        .unwrap();
    assert!(!target.exists());
    node.node_unstage_volume(unstage_req(&vol, &staging))
        .await
        .unwrap();
}

#[tokio::test]
async fn every_node_call_twice_gives_the_same_answer_and_mounts() {
    if !require_root("every_node_call_twice_gives_the_same_answer_and_mounts") {
        return;
    }
    let scratch = Scratch::new("twice");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let vol = create_attached(&agent, "twice", 64 << 20).await;
    let staging = agent.work.join("staging/twice");
    let t1 = agent.work.join("pods/a/mount");
    let t2 = agent.work.join("pods/b/mount");
    let cap = mount_cap("ext4", Mode::SingleNodeWriter);
    let multi = mount_cap("ext4", Mode::SingleNodeMultiWriter);
    let mut node = agent.node().await;

    for _ in 0..2 {
        node.node_stage_volume(stage_req(&vol, &staging, cap.clone()))
            .await
            .unwrap();
        assert_eq!(mounts_under(&scratch.path).len(), 1);
    }
    for _ in 0..2 {
        node.node_publish_volume(publish_req(&vol, &staging, &t1, cap.clone(), false))
            .await
            .unwrap();
        assert_eq!(mounts_under(&scratch.path).len(), 2);
    }
    // Same target, other arguments → ALREADY_EXISTS.
    let e = node
        .node_publish_volume(publish_req(&vol, &staging, &t1, cap.clone(), true))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");
    // A second target for a single-writer volume → FAILED_PRECONDITION.
    let e = node
        .node_publish_volume(publish_req(&vol, &staging, &t2, cap.clone(), false))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    // Unstage while published → FAILED_PRECONDITION.
    let e = node
        .node_unstage_volume(unstage_req(&vol, &staging))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    // Staged with another capability → ALREADY_EXISTS.
    let e = node
        .node_stage_volume(stage_req(
            &vol,
            &staging,
            mount_cap("xfs", Mode::SingleNodeWriter),
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists);
    for _ in 0..2 {
        node.node_unpublish_volume(unpublish_req(&vol, &t1))
            .await
            .unwrap();
        assert_eq!(mounts_under(&scratch.path).len(), 1);
    }
    for _ in 0..2 {
        node.node_unstage_volume(unstage_req(&vol, &staging))
            .await
            .unwrap();
        assert!(mounts_under(&scratch.path).is_empty());
    }
    // A multi-writer volume may be published at two targets.
    node.node_stage_volume(stage_req(&vol, &staging, multi.clone()))
        .await
        .unwrap();
    for t in [&t1, &t2] {
        node.node_publish_volume(publish_req(&vol, &staging, t, multi.clone(), false))
            .await
            .unwrap();
    }
    assert_eq!(mounts_under(&scratch.path).len(), 3);
    for t in [&t1, &t2] {
        node.node_unpublish_volume(unpublish_req(&vol, t))
            .await
            .unwrap();
    }
    node.node_unstage_volume(unstage_req(&vol, &staging))
        .await
        .unwrap();
    // Publish of a volume that is not staged.
    let e = node
        .node_publish_volume(publish_req(&vol, &staging, &t1, multi.clone(), false))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
}

#[tokio::test]
async fn concurrent_stages_of_one_volume_one_is_aborted() {
    if !require_root("concurrent_stages_of_one_volume_one_is_aborted") {
        return;
    }
    let scratch = Scratch::new("concurrent");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let vol = create_attached(&agent, "conc", 1 << 30).await;
    let staging = agent.work.join("staging/conc");
    let cap = mount_cap("xfs", Mode::SingleNodeWriter);
    let mut a = agent.node().await;
    let mut b = agent.node().await;
    let (ra, rb) = tokio::join!(
        a.node_stage_volume(stage_req(&vol, &staging, cap.clone())),
        b.node_stage_volume(stage_req(&vol, &staging, cap.clone()))
    );
    let codes: Vec<Code> = [ra.map(|_| Code::Ok), rb.map(|_| Code::Ok)]
        .into_iter()
        .map(|r| r.unwrap_or_else(|e| e.code()))
        .collect();
    assert!(codes.contains(&Code::Ok), "{codes:?}");
    assert!(codes.contains(&Code::Aborted), "{codes:?}");
    a.node_unstage_volume(unstage_req(&vol, &staging))
        .await
        .unwrap();
}

#[tokio::test]
async fn foreign_mount_at_staging_path_is_refused_not_stacked() {
    if !require_root("foreign_mount_at_staging_path_is_refused_not_stacked") {
        return;
    }
    let scratch = Scratch::new("foreign");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let vol = create_attached(&agent, "foreign", 64 << 20).await;
    let staging = agent.work.join("staging/foreign");
    std::fs::create_dir_all(&staging).unwrap();
    sh(&format!(
        "mount -t tmpfs foreign-tmpfs {}",
        staging.display()
    ));
    let before = mounts_under(&scratch.path);
    let e = agent
        .node()
        .await
        .node_stage_volume(stage_req(
            &vol,
            &staging,
            mount_cap("ext4", Mode::SingleNodeWriter),
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert_eq!(mounts_under(&scratch.path), before, "no mount stacked");
    assert_eq!(fs_uuid(&vol.device), "", "nothing formatted");
    // Unstage must not unmount what is not ours... once the agent knows the volume it refuses;
    // here it does not know it, so unstage with nothing recorded is a no-op success.
    sh(&format!("umount {}", staging.display()));
}

#[tokio::test]
async fn format_options_and_mount_flags_reach_mkfs_and_mount() {
    if !require_root("format_options_and_mount_flags_reach_mkfs_and_mount") {
        return;
    }
    let scratch = Scratch::new("options");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let vol = create_attached(&agent, "opts", 64 << 20).await;
    let staging = agent.work.join("staging/opts");
    let mut req = stage_req(
        &vol,
        &staging,
        mount_cap_flags("ext4", Mode::SingleNodeWriter, &["noatime", "data=journal"]),
    );
    req.volume_context = [
        ("blockSize".to_string(), "1024".to_string()),
        ("inodeSize".to_string(), "512".to_string()),
    ]
    .into();
    let mut node = agent.node().await;
    node.node_stage_volume(req).await.unwrap();
    let out = sh(&format!("tune2fs -l {}", vol.device));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines()
            .any(|l| l.starts_with("Block size:") && l.ends_with(" 1024")),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("Inode size:") && l.ends_with(" 512")),
        "{text}"
    );
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let line = info
        .lines()
        .find(|l| l.contains(staging.to_str().unwrap()))
        .expect("mounted");
    assert!(
        line.contains("noatime") && line.contains("data=journal"),
        "{line}"
    );
    node.node_unstage_volume(unstage_req(&vol, &staging))
        .await
        .unwrap();
}

/// A volume that grew while it was not staged (a snapshot restored into a bigger volume, or an
/// offline expansion): the next stage grows the filesystem to the device (ext offline before the
/// mount; xfs online, through the staging mount's root held open).
#[tokio::test]
async fn stage_grows_an_ext4_volume_offline() {
    stage_grows("ext4", 64 << 20, 256 << 20).await;
}

#[tokio::test]
async fn stage_grows_an_xfs_volume_through_its_held_mount() {
    stage_grows("xfs", 320 << 20, 640 << 20).await;
}

async fn stage_grows(fs: &str, from: i64, to: i64) {
    if !require_root(&format!("stage_grows {fs}")) {
        return;
    }
    let scratch = Scratch::new(&format!("grow-stage-{fs}"));
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let vol = create_attached(&agent, "grow", from).await;
    let staging = agent.work.join("staging/grow");
    let cap = mount_cap(fs, Mode::SingleNodeWriter);
    let mut node = agent.node().await;
    node.node_stage_volume(stage_req(&vol, &staging, cap.clone()))
        .await
        .unwrap();
    std::fs::write(staging.join("kept"), b"kept").unwrap();
    let uuid = fs_uuid(&vol.device);
    node.node_unstage_volume(unstage_req(&vol, &staging))
        .await
        .unwrap();
    agent.expand_on_controller(&vol.id, to, None).await.unwrap();
    node.node_stage_volume(stage_req(&vol, &staging, cap.clone()))
        .await
        .unwrap();
    let st = nix::sys::statvfs::statvfs(&staging).unwrap();
    let total = st.blocks() as u64 * st.fragment_size() as u64;
    assert!(
        total > (to as u64) * 3 / 4,
        "{fs}: grew to the device: {total}"
    );
    assert_eq!(std::fs::read(staging.join("kept")).unwrap(), b"kept");
    assert_eq!(fs_uuid(&vol.device), uuid, "{fs}: grown, not formatted");
    node.node_unstage_volume(unstage_req(&vol, &staging))
        .await
        .unwrap();
}
