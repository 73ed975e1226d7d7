//! The crash matrix: the agent is killed right after each journaled step boundary, restarted on
//! the same state, and the retried call must succeed with nothing formatted twice, no data lost
//! and no mount stacked or missing.

use ebs_tests::crash_points::{self as cp, Op as J, Step as S};

use super::*;

/// An agent ready to crash (`crash_opts`), on a scratch directory named after `prefix` and the
/// crash point, with one attached volume.
async fn crash_agent_with_volume(
    prefix: &str,
    point: &str,
    name: &str,
    bytes: i64,
    fs: &str,
) -> (Scratch, Agent, Cycle) {
    let scratch = format!("{prefix}-{}", point.replace('.', "-"));
    agent_with_volume(&scratch, crash_opts(None), name, bytes, fs).await
}

/// Runs the lifecycle up to `op`, crashing the agent right after `point` is journaled during
/// `op`; then restarts, retries `op`, finishes the cycle and checks every invariant.
async fn crash_at(fs: &str, op: Op, point: &str) {
    let size = if fs == "xfs" { 320 << 20 } else { 64 << 20 };
    let (_scratch, mut agent, c) =
        crash_agent_with_volume(&format!("crash-{fs}"), point, "crash", size, fs).await;
    let order = [Op::Stage, Op::Publish, Op::Unpublish, Op::Unstage];
    let pos = order.iter().position(|o| *o == op).unwrap();
    let mut uuid = String::new();
    for done in &order[..pos] {
        call(&agent, &c, *done).await.unwrap();
        if *done == Op::Stage {
            uuid = fs_uuid(&c.vol.device);
        }
        if *done == Op::Publish {
            std::fs::write(c.target.join("before-crash"), b"survives").unwrap();
        }
    }
    // Restart with the fault armed, then run the op: the agent dies at the point.
    agent.restart(Some(crash_opts(Some(point)))).await;
    let result = call(&agent, &c, op).await;
    let status = agent.wait_exit(Duration::from_secs(20)).await;
    assert!(
        status.is_some(),
        "{point}: the agent did not die (result {result:?})"
    );
    assert!(
        result.is_err(),
        "{point}: the call must not have answered OK"
    );

    agent.restart(Some(crash_opts(None))).await;
    call(&agent, &c, op)
        .await
        .unwrap_or_else(|e| panic!("{point}: retry failed: {e:?}\n{}", agent.log_text()));
    // Retrying once more is still fine (idempotent after recovery).
    call(&agent, &c, op).await.unwrap();
    if op == Op::Publish {
        std::fs::write(c.target.join("before-crash"), b"survives").unwrap();
    }
    for next in &order[pos + 1..] {
        if *next == Op::Unpublish {
            assert_eq!(
                std::fs::read(c.target.join("before-crash")).unwrap(),
                b"survives"
            );
        }
        call(&agent, &c, *next).await.unwrap();
        if *next == Op::Publish {
            std::fs::write(c.target.join("before-crash"), b"survives").unwrap();
        }
    }
    assert_eq!(mount_count(&c.staging), 0, "{point}: staging left mounted");
    assert_eq!(mount_count(&c.target), 0, "{point}: target left mounted");
    // Stage once more to read what is on the volume: one filesystem, the first one, data intact.
    call(&agent, &c, Op::Stage).await.unwrap();
    assert_eq!(
        mount_count(&c.staging),
        1,
        "{point}: stacked or missing staging mount"
    );
    if !uuid.is_empty() {
        assert_eq!(fs_uuid(&c.vol.device), uuid, "{point}: formatted again");
    }
    if pos >= 2 {
        assert_eq!(
            std::fs::read(c.staging.join("before-crash")).unwrap(),
            b"survives",
            "{point}"
        );
    }
    let formats = agent.log_text().matches(" formatted").count();
    assert_eq!(
        formats,
        1,
        "{point}: mkfs must run exactly once\n{}",
        agent.log_text()
    );
    call(&agent, &c, Op::Unstage).await.unwrap();
    eprintln!("{point}: recovered");
}

fn stage_points() -> [String; 11] {
    [
        cp::intent(J::Stage, S::ResolveDevice),
        cp::done(J::Stage, S::ResolveDevice),
        cp::done(J::Stage, S::VerifyIdentity),
        cp::intent(J::Stage, S::Probe),
        cp::done(J::Stage, S::Probe),
        cp::intent(J::Stage, S::Format),
        cp::done(J::Stage, S::Format),
        cp::intent(J::Stage, S::Mount),
        cp::done(J::Stage, S::Mount),
        cp::intent(J::Stage, S::Recheck),
        cp::done(J::Stage, S::Staged),
    ]
}

#[tokio::test]
async fn crash_matrix_stage_ext4() {
    if !require_root("crash_matrix_stage_ext4") {
        return;
    }
    for p in stage_points() {
        crash_at("ext4", Op::Stage, &p).await;
    }
}

#[tokio::test]
async fn crash_matrix_stage_xfs() {
    if !require_root("crash_matrix_stage_xfs") {
        return;
    }
    for p in stage_points() {
        crash_at("xfs", Op::Stage, &p).await;
    }
}

#[tokio::test]
async fn crash_matrix_publish_unpublish_unstage() {
    if !require_root("crash_matrix_publish_unpublish_unstage") {
        return;
    }
    for (op, p) in [
        (Op::Publish, cp::intent(J::Publish, S::Bind)),
        (Op::Publish, cp::done(J::Publish, S::Bind)),
        (Op::Publish, cp::done(J::Publish, S::Published)),
        (Op::Unpublish, cp::intent(J::Unpublish, S::Unmount)),
        (Op::Unpublish, cp::done(J::Unpublish, S::Unmount)),
        (Op::Unpublish, cp::done(J::Unpublish, S::Unpublished)),
        (Op::Unstage, cp::intent(J::Unstage, S::Unmount)),
        (Op::Unstage, cp::done(J::Unstage, S::Unmount)),
        (Op::Unstage, cp::done(J::Unstage, S::Unstaged)),
    ] {
        crash_at("ext4", op, &p).await;
    }
}

/// Stages a volume that is already formatted (the fsck path, where the mount intent is committed
/// while e2fsck runs), crashing at `point`; then retries and checks data, UUID and mounts.
async fn crash_restage_at(point: &str) {
    let (_scratch, mut agent, c) =
        crash_agent_with_volume("crash-restage", point, "restage", 64 << 20, "ext4").await;
    call(&agent, &c, Op::Stage).await.unwrap();
    let uuid = fs_uuid(&c.vol.device);
    std::fs::write(c.staging.join("before-crash"), b"survives").unwrap();
    call(&agent, &c, Op::Unstage).await.unwrap();

    agent.restart(Some(crash_opts(Some(point)))).await;
    let result = call(&agent, &c, Op::Stage).await;
    let status = agent.wait_exit(Duration::from_secs(20)).await;
    assert!(
        status.is_some(),
        "{point}: the agent did not die ({result:?})"
    );
    assert!(
        result.is_err(),
        "{point}: the call must not have answered OK"
    );

    agent.restart(Some(crash_opts(None))).await;
    // An e2fsck orphaned by the crash may still hold the device for a moment: the CO retries.
    let mut retry = call(&agent, &c, Op::Stage).await;
    for _ in 0..20 {
        if retry.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        retry = call(&agent, &c, Op::Stage).await;
    }
    retry.unwrap_or_else(|e| panic!("{point}: retry failed: {e:?}\n{}", agent.log_text()));
    call(&agent, &c, Op::Stage).await.unwrap();
    assert_eq!(
        mount_count(&c.staging),
        1,
        "{point}: stacked or missing mount"
    );
    assert_eq!(
        std::fs::read(c.staging.join("before-crash")).unwrap(),
        b"survives",
        "{point}"
    );
    assert_eq!(fs_uuid(&c.vol.device), uuid, "{point}: formatted again");
    call(&agent, &c, Op::Unstage).await.unwrap();
    assert_eq!(mount_count(&c.staging), 0, "{point}: staging left mounted");
    eprintln!("{point} (restage): recovered");
}

#[tokio::test]
async fn crash_matrix_restage_ext4() {
    if !require_root("crash_matrix_restage_ext4") {
        return;
    }
    for p in [
        cp::done(J::Stage, S::Probe),
        cp::intent(J::Stage, S::Check),
        cp::done(J::Stage, S::Check),
        cp::intent(J::Stage, S::Mount),
        cp::done(J::Stage, S::Mount),
        cp::intent(J::Stage, S::Recheck),
        cp::done(J::Stage, S::Staged),
    ] {
        crash_restage_at(&p).await;
    }
}

/// NodeExpandVolume killed at each of its step boundaries (xfs: it grows online here; ext4's
/// online grow needs CAP_SYS_RESOURCE, which this host cannot grant).
#[tokio::test]
async fn crash_matrix_expand_xfs() {
    if !require_root("crash_matrix_expand_xfs") {
        return;
    }
    for point in [
        cp::intent(J::Expand, S::RefreshSize),
        cp::done(J::Expand, S::RefreshSize),
        cp::intent(J::Expand, S::Grow),
        cp::done(J::Expand, S::Grow),
        cp::done(J::Expand, S::Expanded),
    ] {
        let (_scratch, mut agent, c) =
            crash_agent_with_volume("crash-expand", &point, "exp", 320 << 20, "xfs").await;
        let vol = c.vol.clone();
        call(&agent, &c, Op::Stage).await.unwrap();
        call(&agent, &c, Op::Publish).await.unwrap();
        std::fs::write(c.target.join("before-crash"), b"survives").unwrap();
        let uuid = fs_uuid(&vol.device);
        let to: i64 = 512 << 20;
        agent.expand_on_controller(&vol.id, to, None).await.unwrap();
        let expand = csi::NodeExpandVolumeRequest {
            volume_id: vol.id.clone(),
            volume_path: c.target.display().to_string(),
            staging_target_path: c.staging.display().to_string(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: to,
                limit_bytes: 0,
            }),
            volume_capability: Some(c.cap.clone()),
            ..Default::default()
        };
        agent.restart(Some(crash_opts(Some(&point)))).await;
        let r = agent.node().await.node_expand_volume(expand.clone()).await;
        assert!(
            agent.wait_exit(Duration::from_secs(20)).await.is_some(),
            "{point}: no crash ({r:?})"
        );
        agent.restart(Some(crash_opts(None))).await;
        for _ in 0..2 {
            let r = agent
                .node()
                .await
                .node_expand_volume(expand.clone())
                .await
                .unwrap_or_else(|e| panic!("{point}: retry failed: {e:?}\n{}", agent.log_text()))
                .into_inner();
            assert_eq!(r.capacity_bytes, to, "{point}");
        }
        let st = nix::sys::statvfs::statvfs(&c.target).unwrap();
        assert!(
            st.blocks() as u64 * st.fragment_size() as u64 > 400 << 20,
            "{point}: not grown"
        );
        assert_eq!(
            std::fs::read(c.target.join("before-crash")).unwrap(),
            b"survives"
        );
        assert_eq!(fs_uuid(&vol.device), uuid, "{point}");
        assert_eq!(mount_count(&c.staging), 1, "{point}");
        assert_eq!(mount_count(&c.target), 1, "{point}");
        call(&agent, &c, Op::Unpublish).await.unwrap();
        call(&agent, &c, Op::Unstage).await.unwrap();
        eprintln!("{point}: recovered");
    }
}
