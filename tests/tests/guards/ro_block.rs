//! Item 5: a read-only raw block publication is read-only: a write through the target fails and
//! the device's bytes stay as they were, through v1 and v0; unpublish, a crash at any step and
//! start-up recovery leave no extra loop device behind.

use std::io::Read;
use std::path::Path;
use std::time::Duration;

use ebs_tests::crash_points::{self as cp, Op as J, Step as S};
use ebs_tests::csi_req::*;
use ebs_tests::legacy::*;
use ebs_tests::*;

use csi::volume_capability::access_mode::Mode;

use super::{MIB, backing_file, is_mounted, write_fails};

/// Loop devices laid over `device` (their backing file is the device node).
pub(super) fn loops_over(device: &str) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/sys/block")
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("loop") && backing_file(&name) == device {
            out.push(format!("/dev/{name}"));
        }
    }
    out
}

/// Detaches, on drop, every loop device over `device` (a failed test leaks none).
pub(super) struct Overlays(pub(super) String);

impl Drop for Overlays {
    fn drop(&mut self) {
        for dev in loops_over(&self.0) {
            let _ = std::process::Command::new("losetup")
                .args(["-d", &dev])
                .status();
        }
    }
}

pub(super) fn head(path: &Path) -> Vec<u8> {
    let mut buf = vec![0u8; 4096];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut buf))
        .expect("read the first block");
    buf
}

pub(super) const PATTERN: u8 = 0x5A;

/// A block volume with a known first block, staged at `staging`.
pub(super) async fn staged_block(
    agent: &Agent,
    name: &str,
    mode: Mode,
) -> (Vol, std::path::PathBuf) {
    let vol = create_attached(agent, name, 16 * MIB).await;
    std::fs::write(&vol.device, vec![PATTERN; 4096]).expect("write the first block");
    let staging = agent.work.join(format!("staging/{name}"));
    agent
        .node()
        .await
        .node_stage_volume(stage_req(&vol, &staging, block_cap(mode)))
        .await
        .expect("stage");
    (vol, staging)
}

pub(super) fn target(agent: &Agent, name: &str) -> std::path::PathBuf {
    let t = agent.work.join(format!("pods/{name}/dev"));
    std::fs::create_dir_all(t.parent().unwrap()).unwrap();
    t
}

pub(super) fn check_read_only(vol: &Vol, target: &Path) {
    assert!(is_mounted(target), "nothing bound at {}", target.display());
    write_fails(target).expect("a write into a read-only block publication");
    assert_eq!(
        head(target),
        vec![PATTERN; 4096],
        "the target reads the volume"
    );
    assert_eq!(
        head(Path::new(&vol.device)),
        vec![PATTERN; 4096],
        "device bytes changed"
    );
}

#[tokio::test]
async fn a_read_only_block_publication_is_read_only() {
    let _ns = crate::NAMESPACE_COPY.read().await;
    if !require_root("a_read_only_block_publication_is_read_only") {
        return;
    }
    let scratch = Scratch::new("g-roblk");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    // Several publications on the node: the access mode allows them.
    let (vol, staging) = staged_block(&agent, "blk", Mode::MultiNodeMultiWriter).await;
    let _overlays = Overlays(vol.device.clone());
    let cap = block_cap(Mode::MultiNodeMultiWriter);
    let mut node = agent.node().await;

    // v1, twice at one target (idempotent) and at a second target.
    let (t1, t2) = (target(&agent, "a"), target(&agent, "b"));
    for t in [&t1, &t1, &t2] {
        node.node_publish_volume(publish_req(&vol, &staging, t, cap.clone(), true))
            .await
            .expect("publish readonly");
        check_read_only(&vol, t);
    }
    // A writable publication beside them stays writable.
    let rw = target(&agent, "rw");
    node.node_publish_volume(publish_req(&vol, &staging, &rw, cap.clone(), false))
        .await
        .expect("publish rw");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&rw)
        .expect("the writable publication opens for writing");
    for t in [&t1, &t2, &rw] {
        node.node_unpublish_volume(unpublish_req(&vol, t))
            .await
            .expect("unpublish");
        assert!(!is_mounted(t));
    }
    assert_eq!(
        loops_over(&vol.device),
        Vec::<String>::new(),
        "unpublish left a loop device"
    );

    // v0.3: the same publication through the old door.
    let t0 = target(&agent, "v0");
    let v0cap = v0::VolumeCapability {
        access_type: Some(v0::volume_capability::AccessType::Block(
            v0::volume_capability::BlockVolume {},
        )),
        access_mode: Some(v0::volume_capability::AccessMode {
            mode: v0::volume_capability::access_mode::Mode::MultiNodeMultiWriter as i32,
        }),
    };
    let mut v0n = v0_node(&agent).await;
    v0n.node_publish_volume(v0::NodePublishVolumeRequest {
        volume_id: vol.id.clone(),
        publish_info: vol.publish_context(),
        staging_target_path: staging.display().to_string(),
        target_path: t0.display().to_string(),
        volume_capability: Some(v0cap),
        readonly: true,
        ..Default::default()
    })
    .await
    .expect("v0 publish readonly");
    check_read_only(&vol, &t0);
    v0n.node_unpublish_volume(v0::NodeUnpublishVolumeRequest {
        volume_id: vol.id.clone(),
        target_path: t0.display().to_string(),
    })
    .await
    .expect("v0 unpublish");
    assert_eq!(
        loops_over(&vol.device),
        Vec::<String>::new(),
        "v0 unpublish left a loop device"
    );

    // The loop controller never detaches the volume from under a read-only publication.
    node.node_publish_volume(publish_req(&vol, &staging, &t1, cap.clone(), true))
        .await
        .expect("publish readonly");
    let e = agent
        .controller()
        .await
        .controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
            volume_id: vol.id.clone(),
            node_id: node_id(&agent).await,
            ..Default::default()
        })
        .await
        .expect_err("the volume is published");
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    node.node_unpublish_volume(unpublish_req(&vol, &t1))
        .await
        .expect("unpublish");
    node.node_unstage_volume(unstage_req(&vol, &staging))
        .await
        .expect("unstage");
    assert_eq!(loops_over(&vol.device), Vec::<String>::new());
}

fn crash_opts(point: Option<&str>) -> AgentOpts {
    let mut o = AgentOpts::default();
    if let Some(p) = point {
        o.args.push("--crash-after".into());
        o.args.push(p.into());
    }
    o
}

/// Killed right after each step of a read-only block publish and unpublish, restarted, retried:
/// the retry succeeds, the publication is read-only, and nothing is left after the unpublish.
#[tokio::test]
async fn a_crash_at_any_step_of_a_read_only_block_publication_leaks_nothing() {
    let _ns = crate::NAMESPACE_COPY.read().await;
    if !require_root("a_crash_at_any_step_of_a_read_only_block_publication_leaks_nothing") {
        return;
    }
    let points = [
        ("publish", cp::intent(J::Publish, S::Bind)),
        ("publish", cp::intent(J::Publish, S::RoDevice)),
        ("publish", cp::done(J::Publish, S::RoDevice)),
        ("publish", cp::done(J::Publish, S::Bind)),
        ("unpublish", cp::done(J::Unpublish, S::Unmount)),
        ("unpublish", cp::intent(J::Unpublish, S::DetachRoDevice)),
        ("unpublish", cp::done(J::Unpublish, S::DetachRoDevice)),
    ];
    for (op, point) in points {
        let scratch = Scratch::new(&format!("g-roblk-{}", point.replace('.', "-")));
        let mut agent = Agent::start(&scratch, crash_opts(None)).await;
        let (vol, staging) = staged_block(&agent, "c", Mode::SingleNodeWriter).await;
        let _overlays = Overlays(vol.device.clone());
        let cap = block_cap(Mode::SingleNodeWriter);
        let t = target(&agent, "c");
        let publish = publish_req(&vol, &staging, &t, cap.clone(), true);
        if op == "unpublish" {
            agent
                .node()
                .await
                .node_publish_volume(publish.clone())
                .await
                .expect("publish");
        }
        agent.restart(Some(crash_opts(Some(&point)))).await;
        let mut node = agent.node().await;
        let result = if op == "publish" {
            node.node_publish_volume(publish.clone()).await.map(drop)
        } else {
            node.node_unpublish_volume(unpublish_req(&vol, &t))
                .await
                .map(drop)
        };
        assert!(
            agent.wait_exit(Duration::from_secs(20)).await.is_some(),
            "{point}: the agent did not die ({result:?})"
        );
        agent.restart(Some(crash_opts(None))).await;
        let mut node = agent.node().await;
        if op == "publish" {
            node.node_publish_volume(publish.clone())
                .await
                .unwrap_or_else(|e| panic!("{point}: retry: {e:?}\n{}", agent.log_text()));
            check_read_only(&vol, &t);
            assert_eq!(
                loops_over(&vol.device).len(),
                1,
                "{point}: one read-only device"
            );
        }
        node.node_unpublish_volume(unpublish_req(&vol, &t))
            .await
            .unwrap_or_else(|e| panic!("{point}: unpublish: {e:?}\n{}", agent.log_text()));
        assert!(!is_mounted(&t), "{point}");
        assert_eq!(
            loops_over(&vol.device),
            Vec::<String>::new(),
            "{point}: a read-only device leaked\n{}",
            agent.log_text()
        );
        node.node_unstage_volume(unstage_req(&vol, &staging))
            .await
            .expect("unstage");
    }
}
