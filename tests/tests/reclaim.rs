//! The CSI-Addons endpoint over its real second socket: identity, and online space reclaim
//! (FITRIM) on staged loop volumes whose sparse backing files really shrink.

use std::time::Duration;

use ebs_proto::identity as aid;
use ebs_proto::reclaimspace as rs;
use ebs_tests::addons::*;
use ebs_tests::csi_req::*;
use ebs_tests::*;

use csi::volume_capability::access_mode::Mode;
use tonic::Code;

#[tokio::test]
async fn addons_identity_over_the_second_socket() {
    if !require_root("addons_identity_over_the_second_socket") {
        return;
    }
    use aid::capability::{reclaim_space, service};
    let scratch = Scratch::new("addons-id");
    let mut agent = Agent::start(&scratch, opts(&scratch, &[])).await;
    let info = agent
        .identity()
        .await
        .get_plugin_info(csi::GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    let mut id = addons_identity(&scratch).await;
    let got = id
        .get_identity(aid::GetIdentityRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (got.name.as_str(), got.vendor_version.as_str()),
        (info.name.as_str(), info.vendor_version.as_str())
    );
    let caps = id
        .get_capabilities(aid::GetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities;
    assert_eq!(
        service_types(&caps),
        (
            vec![
                service::Type::ControllerService as i32,
                service::Type::NodeService as i32
            ],
            vec![reclaim_space::Type::Online as i32]
        )
    );
    let probe = id.probe(aid::ProbeRequest {}).await.unwrap().into_inner();
    assert_eq!(probe.ready, Some(true));
    // Offline (controller) reclaim is neither advertised nor served.
    let err = rs::reclaim_space_controller_client::ReclaimSpaceControllerClient::new(
        channel(&addons_socket(&scratch)).await.unwrap(),
    )
    .controller_reclaim_space(rs::ControllerReclaimSpaceRequest {
        volume_id: "lv-x".into(),
        ..Default::default()
    })
    .await
    .unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented);

    agent.terminate().await.expect("clean exit");
    assert!(!addons_socket(&scratch).exists(), "socket removed at exit");

    // A node-only instance does not claim the controller service.
    agent
        .restart(Some(opts(&scratch, &["--mode", "node"])))
        .await;
    let caps = addons_identity(&scratch)
        .await
        .get_capabilities(aid::GetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities;
    assert_eq!(
        service_types(&caps),
        (
            vec![service::Type::NodeService as i32],
            vec![reclaim_space::Type::Online as i32]
        )
    );
}

#[test]
fn addons_endpoint_is_checked_at_start() {
    let scratch = Scratch::new("addons-ep");
    let sock = format!("unix://{}", scratch.join("csi.sock").display());
    let run = |addons: &str| {
        std::process::Command::new(agent_bin())
            .args(["serve", "--backend", "loop", "--endpoint", &sock])
            .args(["--csi-addons-endpoint", addons, "--state-dir"])
            .arg(scratch.join("state"))
            .output()
            .unwrap()
    };
    let same = run(&sock);
    assert!(!same.status.success());
    assert!(
        String::from_utf8_lossy(&same.stderr).contains("must differ from --endpoint"),
        "{}",
        String::from_utf8_lossy(&same.stderr)
    );
    assert!(!scratch.join("csi.sock").exists(), "no socket left behind");
    let tcp = run("tcp://127.0.0.1:9000");
    assert!(!tcp.status.success());
    assert!(String::from_utf8_lossy(&tcp.stderr).contains("unix:///absolute/path.sock"));
}

async fn reclaim_returns_space(fs: &str) {
    let scratch = Scratch::new(&format!("reclaim-{fs}"));
    let agent = Agent::start(&scratch, opts(&scratch, &[])).await;
    let vol = create_attached(&agent, &format!("reclaim-{fs}"), 1 << 30).await;
    let staging = agent.work.join("staging/r");
    let target = agent.work.join("pods/p1/mount");
    let cap = mount_cap(fs, Mode::SingleNodeWriter);
    let mut node = agent.node().await;
    node.node_stage_volume(stage_req(&vol, &staging, cap.clone()))
        .await
        .unwrap();
    node.node_publish_volume(publish_req(&vol, &staging, &target, cap.clone(), false))
        .await
        .unwrap();
    let file = backing_file(&vol.device);
    let empty = allocated(&file);
    fill(&target.join("big"), 256 * MIB);
    let full = allocated(&file);
    assert!(full >= empty + 250 * MIB, "{fs}: {empty} -> {full}");
    let free_before = free_bytes(&target);
    std::fs::remove_file(target.join("big")).unwrap();
    wait_freed(&target, free_before + 250 * MIB);

    let mut rc = reclaimer(&scratch).await;
    let r = rc
        .node_reclaim_space(reclaim_req(&vol.id, &staging))
        .await
        .unwrap()
        .into_inner();
    let (pre, post) = usage(&r);
    let after = allocated(&file);
    eprintln!(
        "{fs}: backing file empty {} MiB, full {} MiB, reported pre {} MiB post {} MiB, \
         after {} MiB",
        empty / MIB,
        full / MIB,
        pre / MIB,
        post / MIB,
        after / MIB
    );
    assert!(pre + 16 * MIB >= full, "{fs}: pre {pre} vs full {full}");
    assert!(post + 200 * MIB <= pre, "{fs}: pre {pre} post {post}");
    assert!(after + 200 * MIB <= full, "{fs}: the backing file shrank");
    // The report is the backing file's allocation (a commit may add a few blocks since).
    assert!(
        after.abs_diff(post) <= 4 * MIB,
        "{fs}: post {post} vs st_blocks {after}"
    );

    // A caller that knows only the workload's mount path.
    let r = rc
        .node_reclaim_space(rs::NodeReclaimSpaceRequest {
            volume_id: vol.id.clone(),
            volume_path: target.display().to_string(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let (pre2, post2) = usage(&r);
    assert!(post2 <= pre2 + 4 * MIB, "{fs}: nothing left to reclaim");
    assert!(agent.log_text().contains("space reclaimed"));

    node.node_unpublish_volume(unpublish_req(&vol, &target))
        .await
        .unwrap();
    node.node_unstage_volume(unstage_req(&vol, &staging))
        .await
        .unwrap();
}

#[tokio::test]
async fn reclaim_returns_space_ext4() {
    if require_root("reclaim_returns_space_ext4") {
        reclaim_returns_space("ext4").await;
    }
}

#[tokio::test]
async fn reclaim_returns_space_xfs() {
    if require_root("reclaim_returns_space_xfs") {
        reclaim_returns_space("xfs").await;
    }
}

#[tokio::test]
async fn block_volume_reclaim_is_unimplemented() {
    if !require_root("block_volume_reclaim_is_unimplemented") {
        return;
    }
    let scratch = Scratch::new("reclaim-block");
    let agent = Agent::start(&scratch, opts(&scratch, &[])).await;
    let vol = create_attached(&agent, "reclaim-block", 64 << 20).await;
    let staging = agent.work.join("staging/b");
    let mut node = agent.node().await;
    node.node_stage_volume(stage_req(&vol, &staging, block_cap(Mode::SingleNodeWriter)))
        .await
        .unwrap();
    let err = reclaimer(&scratch)
        .await
        .node_reclaim_space(reclaim_req(&vol.id, &staging))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented, "{err:?}");
    assert!(err.message().contains("block access"), "{}", err.message());
    node.node_unstage_volume(unstage_req(&vol, &staging))
        .await
        .unwrap();
}

#[tokio::test]
async fn unknown_volumes_and_paths_are_not_found() {
    if !require_root("unknown_volumes_and_paths_are_not_found") {
        return;
    }
    let scratch = Scratch::new("reclaim-nf");
    let agent = Agent::start(&scratch, opts(&scratch, &[])).await;
    let vol = create_attached(&agent, "reclaim-nf", 64 << 20).await;
    let staging = agent.work.join("staging/nf");
    let cap = mount_cap("ext4", Mode::SingleNodeWriter);
    let mut node = agent.node().await;
    let mut rc = reclaimer(&scratch).await;
    let code = |r: Result<tonic::Response<rs::NodeReclaimSpaceResponse>, tonic::Status>| {
        r.map(|_| Code::Ok).unwrap_or_else(|e| e.code())
    };

    // Attached, not staged; a volume nobody knows.
    let r = rc.node_reclaim_space(reclaim_req(&vol.id, &staging)).await;
    assert_eq!(code(r), Code::NotFound);
    let r = rc
        .node_reclaim_space(reclaim_req("lv-0000000000000000", &staging))
        .await;
    assert_eq!(code(r), Code::NotFound);

    node.node_stage_volume(stage_req(&vol, &staging, cap.clone()))
        .await
        .unwrap();
    let before = mounts_below(&scratch.path);
    let elsewhere = agent.work.join("staging/other");
    let r = rc
        .node_reclaim_space(reclaim_req(&vol.id, &elsewhere))
        .await;
    assert_eq!(code(r), Code::NotFound, "another staging path");
    let r = rc
        .node_reclaim_space(rs::NodeReclaimSpaceRequest {
            volume_id: vol.id.clone(),
            volume_path: agent.work.join("pods/none/mount").display().to_string(),
            ..Default::default()
        })
        .await;
    assert_eq!(code(r), Code::NotFound, "not a publication");
    // Malformed requests are INVALID_ARGUMENT, as everywhere else.
    let r = rc
        .node_reclaim_space(rs::NodeReclaimSpaceRequest {
            volume_id: vol.id.clone(),
            ..Default::default()
        })
        .await;
    assert_eq!(code(r), Code::InvalidArgument, "no path at all");
    let r = rc.node_reclaim_space(reclaim_req("", &staging)).await;
    assert_eq!(code(r), Code::InvalidArgument, "no volume id");
    assert_eq!(mounts_below(&scratch.path), before, "nothing changed");

    // The right call works; after unstaging, the same call is NOT_FOUND.
    rc.node_reclaim_space(reclaim_req(&vol.id, &staging))
        .await
        .unwrap();
    node.node_unstage_volume(unstage_req(&vol, &staging))
        .await
        .unwrap();
    let r = rc.node_reclaim_space(reclaim_req(&vol.id, &staging)).await;
    assert_eq!(code(r), Code::NotFound, "after unstage");
}

#[tokio::test]
async fn device_without_discard_is_unimplemented() {
    if !require_root("device_without_discard_is_unimplemented") {
        return;
    }
    // Volume files on ramfs, which cannot punch holes: the loop driver advertises no discard
    // for them (decided at attach, so nothing sticks to the loop device afterwards).
    let scratch = Scratch::new("reclaim-nodiscard");
    let volumes = scratch.join("state/volumes");
    std::fs::create_dir_all(&volumes).unwrap();
    sh(&format!(
        "mount -t ramfs reclaim-ramfs {}",
        volumes.display()
    ));
    let agent = Agent::start(&scratch, opts(&scratch, &[])).await;
    let vol = create_attached(&agent, "nodiscard", 64 << 20).await;
    assert_eq!(
        discard_max_bytes(&vol.device),
        0,
        "precondition: no discard"
    );
    let staging = agent.work.join("staging/nd");
    let mut node = agent.node().await;
    node.node_stage_volume(stage_req(
        &vol,
        &staging,
        mount_cap("ext4", Mode::SingleNodeWriter),
    ))
    .await
    .unwrap();
    let err = reclaimer(&scratch)
        .await
        .node_reclaim_space(reclaim_req(&vol.id, &staging))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented, "{err:?}");
    assert!(
        err.message()
            .contains("does not support discard; do not retry"),
        "{}",
        err.message()
    );
    node.node_unstage_volume(unstage_req(&vol, &staging))
        .await
        .unwrap();
}

#[tokio::test]
async fn concurrent_reclaims_of_one_volume_one_is_aborted() {
    if !require_root("concurrent_reclaims_of_one_volume_one_is_aborted") {
        return;
    }
    // Deterministic overlap without any slow-down in the agent: the volume files live on a
    // filesystem of their own, which the test freezes. A reclaim syncs the volume's filesystem
    // before trimming; with fresh dirty data that sync needs loop writes into the frozen
    // filesystem, so the reclaim that holds the volume's guard cannot finish until the thaw.
    let scratch = Scratch::new("reclaim-conc");
    let volumes = scratch.join("state/volumes");
    std::fs::create_dir_all(&volumes).unwrap();
    let outer = scratch.join("outer.img");
    sh(&format!(
        "truncate -s 1G {0} && mkfs.ext4 -q {0} && mount -o loop {0} {1}",
        outer.display(),
        volumes.display()
    ));
    let agent = Agent::start(&scratch, opts(&scratch, &[])).await;
    let vol = create_attached(&agent, "conc", 256 << 20).await;
    let staging = agent.work.join("staging/conc");
    let mut node = agent.node().await;
    node.node_stage_volume(stage_req(
        &vol,
        &staging,
        mount_cap("ext4", Mode::SingleNodeWriter),
    ))
    .await
    .unwrap();

    let thaw = Thaw::freeze(&volumes);
    // Dirty data written after the freeze cannot have reached the volume file yet.
    std::fs::write(staging.join("dirty"), vec![7u8; MIB as usize]).unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for _ in 0..2 {
        let mut rc = reclaimer(&scratch).await;
        let req = reclaim_req(&vol.id, &staging);
        let tx = tx.clone();
        tokio::spawn(async move {
            let code = match rc.node_reclaim_space(req).await {
                Ok(_) => Code::Ok,
                Err(e) => e.code(),
            };
            let _ = tx.send(code);
        });
    }
    let first = tokio::time::timeout(Duration::from_secs(20), rx.recv())
        .await
        .expect("one reclaim returns while the other is held")
        .unwrap();
    assert_eq!(first, Code::Aborted, "the loser is ABORTED");
    // The same guard as stage/publish: other operations on the volume clash too.
    let err = node
        .node_unstage_volume(unstage_req(&vol, &staging))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Aborted);

    drop(thaw);
    let second = tokio::time::timeout(Duration::from_secs(60), rx.recv())
        .await
        .expect("the held reclaim finishes after the thaw")
        .unwrap();
    assert_eq!(second, Code::Ok);
    node.node_unstage_volume(unstage_req(&vol, &staging))
        .await
        .unwrap();
}

/// ext4's FITRIM does not look at the mount's read-only flag (a twentieth fresh review's F2): a
/// volume staged read-only is refused with FAILED_PRECONDITION, and its blocks stay allocated.
#[tokio::test]
async fn a_volume_staged_read_only_is_never_trimmed() {
    if !require_root("a_volume_staged_read_only_is_never_trimmed") {
        return;
    }
    let scratch = Scratch::new("reclaim-ro");
    let agent = Agent::start(&scratch, opts(&scratch, &[])).await;
    let vol = create_attached(&agent, "reclaim-ro", 256 << 20).await;
    let staging = agent.work.join("staging/ro");
    let mut node = agent.node().await;
    let rw = mount_cap("ext4", Mode::SingleNodeWriter);
    node.node_stage_volume(stage_req(&vol, &staging, rw))
        .await
        .unwrap();
    fill(&staging.join("big"), 64 * MIB);
    let free_before = free_bytes(&staging);
    std::fs::remove_file(staging.join("big")).unwrap();
    wait_freed(&staging, free_before + 60 * MIB);
    node.node_unstage_volume(unstage_req(&vol, &staging))
        .await
        .unwrap();
    let ro = mount_cap("ext4", Mode::SingleNodeReaderOnly);
    node.node_stage_volume(stage_req(&vol, &staging, ro))
        .await
        .unwrap();
    let file = backing_file(&vol.device);
    let held = allocated(&file);
    let err = reclaimer(&scratch)
        .await
        .node_reclaim_space(reclaim_req(&vol.id, &staging))
        .await
        .expect_err("a read-only staging was trimmed");
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(allocated(&file) + MIB >= held, "blocks were discarded");
    node.node_unstage_volume(unstage_req(&vol, &staging))
        .await
        .unwrap();
}
