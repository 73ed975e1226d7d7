//! Growing mounted filesystems and block volumes; expansion and stats refusals.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ebs_tests::csi_req::*;
use ebs_tests::*;

use csi::volume_capability::access_mode::Mode;
use csi::volume_usage::Unit;
use tonic::Code;

use super::*;

async fn grow_mounted(fs: &str, from: i64, to: i64) {
    let scratch = Scratch::new(&format!("grow-{fs}"));
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let p = placed(
        &agent,
        &format!("grow-{fs}"),
        from,
        mount_cap(fs, Mode::SingleNodeWriter),
    )
    .await;
    let data = p.target.join("data.bin");
    sh(&format!(
        "head -c {} /dev/urandom > {}",
        8 * MIB,
        data.display()
    ));
    let before = checksum(&data);
    let (total_before, _, _) = statvfs_bytes(&p.target);

    let stop = Arc::new(AtomicBool::new(false));
    let writer = start_writer(p.target.join("log.txt"), Arc::clone(&stop));
    tokio::time::sleep(Duration::from_millis(200)).await;

    let c = controller_expand(&agent, &p, to).await;
    assert_eq!(c.capacity_bytes, to);
    assert!(
        c.node_expansion_required,
        "a filesystem volume needs the node to grow it"
    );
    let mut node = agent.node().await;
    let started = Instant::now();
    let r = node
        .node_expand_volume(node_expand_req(&p, &p.target, to, 0))
        .await;
    if fs != "xfs" && !has_sys_resource() {
        // The kernel grows a mounted ext4 only for CAP_SYS_RESOURCE; some sandboxes drop it.
        let err = r.unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
        assert!(err.message().contains("CAP_SYS_RESOURCE"), "{err:?}");
        stop.store(true, Ordering::Relaxed);
        check_writer_file(&p.target.join("log.txt"), writer.join().unwrap());
        assert_eq!(checksum(&data), before);
        // Not a skip: this host cannot grant the capability (it is missing from the bounding
        // set), so what runs here is the refusal path, checked above with the data intact. The
        // ext growth itself runs for real in `stage_grows_an_ext4_volume_offline`.
        eprintln!("online {fs} growth refused as expected: this host lacks CAP_SYS_RESOURCE");
        return;
    }
    let r = r.expect("node expand").into_inner();
    let grow_ms = started.elapsed().as_millis();
    assert_eq!(r.capacity_bytes, to, "the answer is the device's new size");
    assert_eq!(device_size(&p.vol.device), to);

    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::Relaxed);
    let written = writer.join().unwrap();
    assert!(written > 0);
    check_writer_file(&p.target.join("log.txt"), written);
    assert_eq!(checksum(&data), before, "the data survived the grow");

    let (total_after, _, _) = statvfs_bytes(&p.target);
    assert!(total_after > total_before, "{total_after} > {total_before}");
    // statvfs leaves out the filesystem's own metadata (xfs: its whole log), so compare growth:
    // nearly all of the added bytes are usable.
    let added = total_after - total_before;
    assert!(
        added as f64 > (to - from) as f64 * 0.9 && total_after <= to,
        "statvfs total {total_before} -> {total_after} for {from} -> {to}"
    );
    eprintln!(
        "{fs}: grew {from} -> {to} bytes in {grow_ms} ms; statvfs total {total_before} -> {total_after}"
    );

    // A second identical call is a no-op success: nothing is grown again.
    let again = node
        .node_expand_volume(node_expand_req(&p, &p.target, to, 0))
        .await
        .expect("second node expand")
        .into_inner();
    assert_eq!(again.capacity_bytes, to);
    assert_eq!(statvfs_bytes(&p.target).0, total_after);
    let log = agent.log_text();
    let grown: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("expanded") && l.contains(&p.vol.id))
        .collect();
    assert_eq!(grown.len(), 2, "{grown:?}");
    assert!(
        grown[0].contains("grown=true") && grown[1].contains("grown=false"),
        "{grown:?}"
    );
    // The staging path is an accepted volume_path too.
    let via_staging = node
        .node_expand_volume(node_expand_req(&p, &p.staging, to, 0))
        .await
        .expect("expand via staging path")
        .into_inner();
    assert_eq!(via_staging.capacity_bytes, to);

    // Stats equal statvfs of the mount.
    let s = stats(&agent, &p.vol.id, &p.target).await.unwrap();
    assert_eq!(condition(&s), (false, "volume is healthy".to_string()));
    let bytes = s
        .usage
        .iter()
        .find(|u| u.unit == Unit::Bytes as i32)
        .unwrap();
    let (total, available, used) = statvfs_bytes(&p.target);
    assert_eq!(
        (bytes.total, bytes.available, bytes.used),
        (total, available, used)
    );
    let inodes = s
        .usage
        .iter()
        .find(|u| u.unit == Unit::Inodes as i32)
        .unwrap();
    let st = nix::sys::statvfs::statvfs(&p.target).unwrap();
    assert_eq!(inodes.total, st.files() as i64);
    assert_eq!(inodes.used, (st.files() - st.files_free()) as i64);
}

#[tokio::test]
async fn grow_mounted_ext4_under_a_writer() {
    if !require_root("grow_mounted_ext4_under_a_writer") {
        return;
    }
    grow_mounted("ext4", 64 * MIB, 160 * MIB).await;
}

#[tokio::test]
async fn grow_mounted_xfs_under_a_writer() {
    if !require_root("grow_mounted_xfs_under_a_writer") {
        return;
    }
    // mkfs.xfs refuses filesystems under 300 MB.
    grow_mounted("xfs", 320 * MIB, 512 * MIB).await;
}

#[tokio::test]
async fn block_expand_and_stats_answer_the_device_size() {
    if !require_root("block_expand_and_stats_answer_the_device_size") {
        return;
    }
    let scratch = Scratch::new("grow-block");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let p = placed(
        &agent,
        "grow-block",
        32 * MIB,
        block_cap(Mode::SingleNodeWriter),
    )
    .await;
    let s = stats(&agent, &p.vol.id, &p.target).await.unwrap();
    assert_eq!(s.usage.len(), 1);
    assert_eq!(s.usage[0].total, 32 * MIB);
    assert_eq!(s.usage[0].unit, Unit::Bytes as i32);
    assert!(!condition(&s).0, "{:?}", condition(&s));

    let c = controller_expand(&agent, &p, 48 * MIB).await;
    assert!(
        !c.node_expansion_required,
        "a block volume needs no filesystem work"
    );
    let r = agent
        .node()
        .await
        .node_expand_volume(node_expand_req(&p, &p.target, 48 * MIB, 0))
        .await
        .expect("block node expand")
        .into_inner();
    assert_eq!(r.capacity_bytes, 48 * MIB);
    assert_eq!(device_size(&p.vol.device), 48 * MIB);
    for path in [&p.target, &p.staging] {
        let s = stats(&agent, &p.vol.id, path).await.unwrap();
        assert_eq!(
            s.usage[0].total,
            device_size(&p.vol.device),
            "{}",
            path.display()
        );
        assert!(!condition(&s).0);
    }
}

#[tokio::test]
async fn expand_and_stats_refuse_bad_requests() {
    if !require_root("expand_and_stats_refuse_bad_requests") {
        return;
    }
    let scratch = Scratch::new("expand-errors");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let p = placed(
        &agent,
        "errs",
        32 * MIB,
        mount_cap("ext4", Mode::SingleNodeWriter),
    )
    .await;
    let mut node = agent.node().await;
    let code = |r: Result<tonic::Response<csi::NodeExpandVolumeResponse>, tonic::Status>| {
        r.unwrap_err().code()
    };

    assert_eq!(
        code(
            node.node_expand_volume(node_expand_req(&p, &p.target, 64 * MIB, 48 * MIB))
                .await
        ),
        Code::OutOfRange
    );
    // The controller has not grown the volume: the device cannot satisfy the range.
    assert_eq!(
        code(
            node.node_expand_volume(node_expand_req(&p, &p.target, 64 * MIB, 0))
                .await
        ),
        Code::OutOfRange
    );
    let mut unknown = node_expand_req(&p, &p.target, 0, 0);
    unknown.volume_id = "lv-unknown".into();
    assert_eq!(code(node.node_expand_volume(unknown).await), Code::NotFound);
    let elsewhere = agent.work.join("k/pods/other/mount");
    assert_eq!(
        code(
            node.node_expand_volume(node_expand_req(&p, &elsewhere, 0, 0))
                .await
        ),
        Code::NotFound
    );
    let mut as_block = node_expand_req(&p, &p.target, 0, 0);
    as_block.volume_capability = Some(block_cap(Mode::SingleNodeWriter));
    assert_eq!(
        code(node.node_expand_volume(as_block).await),
        Code::InvalidArgument
    );
    let mut no_path = node_expand_req(&p, &p.target, 0, 0);
    no_path.volume_path = String::new();
    assert_eq!(
        code(node.node_expand_volume(no_path).await),
        Code::InvalidArgument
    );

    let mut c = agent.controller().await;
    let cexp = |req: i64, lim: i64| csi::ControllerExpandVolumeRequest {
        volume_id: p.vol.id.clone(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: req,
            limit_bytes: lim,
        }),
        ..Default::default()
    };
    assert_eq!(
        c.controller_expand_volume(cexp(64 * MIB, 48 * MIB))
            .await
            .unwrap_err()
            .code(),
        Code::OutOfRange
    );
    assert_eq!(
        c.controller_expand_volume(cexp(MIB, 16 * MIB))
            .await
            .unwrap_err()
            .code(),
        Code::OutOfRange,
        "no shrink"
    );
    let same = c
        .controller_expand_volume(cexp(16 * MIB, 0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        same.capacity_bytes,
        32 * MIB,
        "already large enough: a no-op"
    );

    // Stats: unknown volume, unknown path.
    assert_eq!(
        stats(&agent, "lv-unknown", &p.target)
            .await
            .unwrap_err()
            .code(),
        Code::NotFound
    );
    assert_eq!(
        stats(&agent, &p.vol.id, &elsewhere)
            .await
            .unwrap_err()
            .code(),
        Code::NotFound
    );

    // Staged but not mounted any more (as after a reboot): expansion cannot run.
    node.node_unpublish_volume(unpublish_req(&p.vol, &p.target))
        .await
        .unwrap();
    sh(&format!("umount {}", p.staging.display()));
    assert_eq!(
        code(
            node.node_expand_volume(node_expand_req(&p, &p.staging, 0, 0))
                .await
        ),
        Code::FailedPrecondition
    );

    let caps = node
        .node_get_capabilities(csi::NodeGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    let rpcs: Vec<i32> = caps
        .capabilities
        .iter()
        .filter_map(|c| match &c.r#type {
            Some(csi::node_service_capability::Type::Rpc(r)) => Some(r.r#type),
            _ => None,
        })
        .collect();
    use csi::node_service_capability::rpc::Type;
    for t in [
        Type::StageUnstageVolume,
        Type::GetVolumeStats,
        Type::ExpandVolume,
        Type::VolumeCondition,
        Type::SingleNodeMultiWriter,
    ] {
        assert!(rpcs.contains(&(t as i32)), "{t:?} in {rpcs:?}");
    }
}
