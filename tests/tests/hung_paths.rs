//! A request path below a dead mount (a hung NFS or FUSE server under kubelet's directory) makes
//! the agent's path resolution hang in the kernel. It runs on blocking threads, so Probe and
//! every other volume keep their answers, a hung volume holds at most one thread per kind of call,
//! and the hung calls end when the mount's server does. (Stats consult the records before any
//! path: only a volume whose own recorded path went below the dead mount can hang them.)
//! Its own test binary: nothing else may walk into the hung mount meanwhile.

use std::time::Duration;

use ebs_tests::csi::volume_capability::access_mode::Mode;
use ebs_tests::csi_req::{create_attached, mount_cap, stage_req, stats_req, unpublish_by_id};
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
        skip(test, "no /dev/fuse");
        return;
    }
    let scratch = Scratch::new("hung-paths");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    // Stats answer NOT_FOUND from the records for a volume or path they do not know, without
    // touching the path; so the stats calls are for two staged volumes whose staging paths a
    // dead mount then covers.
    let cover = agent.work.join("covered");
    let staged_below = |i: usize| cover.join(format!("stage-{i}"));
    let mut vols = Vec::new();
    for i in 0..2 {
        let vol = create_attached(&agent, &format!("hung-{i}"), 16 << 20).await;
        agent
            .node()
            .await
            .node_stage_volume(stage_req(
                &vol,
                &staged_below(i),
                mount_cap("ext4", Mode::SingleNodeWriter),
            ))
            .await
            .expect("stage");
        vols.push(vol);
    }
    // Declared after the agent and the scratch directory, so dropped (aborted) before either.
    let mut hung = HungMount::new(&agent.work.join("hung")).expect("mount a FUSE stand-in");
    let covering = HungMount::new(&cover).expect("cover the staging paths");

    // More hung calls than the agent has async workers, of both kinds: guarded (unpublish) and
    // lock-free (stats).
    let below = |i: usize| hung.path().join(format!("pod-{i}/volumes/mount"));
    let mut calls = Vec::new();
    for i in 0..4 {
        let mut node = agent.node().await;
        let req = unpublish_by_id(&format!("hung-{i}"), &below(i));
        calls.push(tokio::spawn(async move {
            node.node_unpublish_volume(req).await.map(drop)
        }));
    }
    for (i, vol) in vols.iter().enumerate() {
        let mut node = agent.node().await;
        let req = stats_req(&vol.id, &staged_below(i));
        calls.push(tokio::spawn(async move {
            node.node_get_volume_stats(req).await.map(drop)
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
    let mut node = agent.node().await;
    let caps = timeout(
        quick,
        node.node_get_capabilities(csi::NodeGetCapabilitiesRequest {}),
    )
    .await;
    assert!(matches!(caps, Ok(Ok(_))), "{caps:?}");
    // Host work for another volume, on another path, still runs.
    let other = agent.work.join("elsewhere/mount");
    let unpublish = timeout(
        quick,
        node.node_unpublish_volume(unpublish_by_id("not-hung", &other)),
    )
    .await;
    assert!(matches!(unpublish, Ok(Ok(_))), "{unpublish:?}");
    // A second stats call for a volume whose first one hangs is turned away instead of taking
    // another thread (kubelet asks every minute; the pool would run dry).
    let again = timeout(
        quick,
        node.node_get_volume_stats(stats_req(&vols[0].id, &staged_below(0))),
    )
    .await;
    match again {
        Ok(Err(status)) => assert_eq!(status.code(), tonic::Code::Aborted, "{status:?}"),
        other => panic!("a second stats call should be ABORTED at once: {other:?}"),
    }

    // The server goes away: the waiting calls end (with an error or not), none is left behind.
    hung.release();
    drop(covering);
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
