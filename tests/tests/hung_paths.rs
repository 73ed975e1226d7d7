//! A request path below a dead mount (a hung NFS or FUSE server under kubelet's directory) makes
//! the agent's path checks hang in the kernel. Those checks run on blocking threads, so Probe and
//! every other volume keep their answers, a hung volume holds at most one thread per kind of call,
//! and the hung calls end when the mount's server does.
//! Its own test binary: nothing else may walk into the hung mount meanwhile.

use std::time::Duration;

use ebs_tests::hung_mount::HungMount;
use ebs_tests::*;

use tokio::time::timeout;

#[tokio::test]
async fn a_path_check_hanging_below_a_dead_mount_leaves_probe_and_other_volumes_answering() {
    let test = "a_path_check_hanging_below_a_dead_mount_leaves_probe_and_other_volumes_answering";
    if !require_root(test) {
        return;
    }
    // The test host has FUSE; a container without the device node may not.
    if !std::path::Path::new("/dev/fuse").exists() {
        assert_ne!(
            std::env::var("CI").as_deref(),
            Ok("true"),
            "{test} needs /dev/fuse and CI=true: refusing to skip"
        );
        eprintln!("skipping {test}: no /dev/fuse");
        return;
    }
    let scratch = Scratch::new("hung-paths");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    // Declared after the agent and the scratch directory, so dropped (aborted) before either.
    let mut hung = HungMount::new(&agent.state_dir.join("hung")).expect("mount a FUSE stand-in");

    // More hung calls than the agent has async workers, of both kinds: guarded (unpublish) and
    // lock-free (stats).
    let mut calls = Vec::new();
    for i in 0..4 {
        let mut node = agent.node().await;
        let target = hung.path().join(format!("pod-{i}/volumes/mount"));
        calls.push(tokio::spawn(async move {
            node.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
                volume_id: format!("hung-{i}"),
                target_path: target.display().to_string(),
            })
            .await
            .map(drop)
        }));
    }
    for i in 0..2 {
        let mut node = agent.node().await;
        let path = hung.path().join(format!("pod-{i}/volumes/mount"));
        calls.push(tokio::spawn(async move {
            node.node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
                volume_id: format!("hung-{i}"),
                volume_path: path.display().to_string(),
                staging_target_path: String::new(),
            })
            .await
            .map(drop)
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        calls.iter().all(|c| !c.is_finished()),
        "the calls below the dead mount should be waiting on it"
    );

    let quick = Duration::from_secs(3);
    let probe = timeout(quick, agent.identity().await.probe(csi::ProbeRequest {})).await;
    assert!(
        matches!(probe, Ok(Ok(_))),
        "Probe must answer while path checks hang: {probe:?}"
    );
    let caps = timeout(
        quick,
        agent
            .node()
            .await
            .node_get_capabilities(csi::NodeGetCapabilitiesRequest {}),
    )
    .await;
    assert!(matches!(caps, Ok(Ok(_))), "{caps:?}");
    // Host work for another volume, on another path, still runs.
    let other = agent.state_dir.join("elsewhere/mount");
    let unpublish = timeout(
        quick,
        agent
            .node()
            .await
            .node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
                volume_id: "not-hung".into(),
                target_path: other.display().to_string(),
            }),
    )
    .await;
    assert!(matches!(unpublish, Ok(Ok(_))), "{unpublish:?}");
    // A second stats call for a volume whose first one hangs is turned away instead of taking
    // another thread (kubelet asks every minute; the pool would run dry).
    let again = timeout(
        quick,
        agent
            .node()
            .await
            .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
                volume_id: "hung-0".into(),
                volume_path: hung
                    .path()
                    .join("pod-0/volumes/mount")
                    .display()
                    .to_string(),
                staging_target_path: String::new(),
            }),
    )
    .await;
    match again {
        Ok(Err(status)) => assert_eq!(status.code(), tonic::Code::Aborted, "{status:?}"),
        other => panic!("a second stats call should be ABORTED at once: {other:?}"),
    }

    // The server goes away: the waiting calls end (with an error or not), none is left behind.
    hung.release();
    for call in calls {
        let ended = timeout(Duration::from_secs(10), call).await;
        assert!(
            ended.is_ok(),
            "a call stayed hung after the mount was aborted"
        );
    }
    assert!(
        agent.log_text().lines().all(|l| !l.contains("panicked")),
        "{}",
        agent.log_text()
    );
}
