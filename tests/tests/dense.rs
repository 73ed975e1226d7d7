//! Issue 20: on a dense node the cost of a call does not grow with the host's mount count. The
//! node calls ask the kernel about their own paths only (statx, statmount) and never read the
//! whole mount table, whose size grows with every pod's secret and token mounts; but for one
//! question, asked by a stage only: whether anything binds the device raw (issue 49: a device
//! bound raw elsewhere was formatted or mounted under its writer), which only the mount tables
//! can answer.

use ebs_tests::csi_req::*;
use ebs_tests::http::{free_port, http_get, sample};
use ebs_tests::*;

use csi::volume_capability::access_mode::Mode;

fn table_reads(port: u16) -> f64 {
    sample(
        &http_get(port, "/metrics").1,
        "ebs_agent_mount_table_reads_total",
    )
}

/// Whether this kernel answers statmount(2) (6.8+); before it, a mount root's line is looked up
/// in the table, as documented.
fn has_statmount() -> bool {
    let release = nix::sys::utsname::uname().map(|u| u.release().to_string_lossy().into_owned());
    let version: Vec<u32> = release
        .unwrap_or_default()
        .split(|c: char| !c.is_ascii_digit())
        .take(2)
        .filter_map(|n| n.parse().ok())
        .collect();
    version >= vec![6, 8]
}

#[tokio::test]
async fn node_calls_never_read_the_mount_table() {
    if !require_root("node_calls_never_read_the_mount_table") {
        return;
    }
    if !has_statmount() {
        assert_ne!(
            std::env::var("CI").as_deref(),
            Ok("true"),
            "CI runs on 6.8+"
        );
        skip(
            "node_calls_never_read_the_mount_table",
            "no statmount(2) before Linux 6.8",
        );
        return;
    }
    let scratch = Scratch::new("dense");
    let port = free_port();
    let opts = AgentOpts::with_metrics(format!("127.0.0.1:{port}"));
    let agent = Agent::start(&scratch, opts).await;
    let mut node = agent.node().await;
    for (name, cap) in [
        ("fs", mount_cap("ext4", Mode::SingleNodeWriter)),
        ("blk", block_cap(Mode::SingleNodeWriter)),
    ] {
        let vol = create_attached(&agent, name, 32 << 20).await;
        let staging = agent.work.join(format!("staging/{name}"));
        let target = agent.work.join(format!("pods/{name}/vol"));
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        let before = table_reads(port);
        node.node_stage_volume(stage_req(&vol, &staging, cap.clone()))
            .await
            .unwrap();
        // A stage asks whether anything binds the device raw (binds show in the mount tables
        // and nowhere else): once when it takes the device, once more after a filesystem's
        // mount. Every other call reads no table.
        let staged = table_reads(port);
        let asked = if name == "fs" { 2.0 } else { 1.0 };
        assert!(
            staged - before <= asked,
            "{name}: the stage read the mount table {} times",
            staged - before
        );
        let before = staged;
        node.node_publish_volume(publish_req(&vol, &staging, &target, cap.clone(), false))
            .await
            .unwrap();
        for path in [&staging, &target] {
            node.node_get_volume_stats(stats_req(&vol.id, path))
                .await
                .unwrap();
        }
        node.node_unpublish_volume(unpublish_req(&vol, &target))
            .await
            .unwrap();
        node.node_unstage_volume(unstage_req(&vol, &staging))
            .await
            .unwrap();
        assert_eq!(
            table_reads(port),
            before,
            "{name}: a node call read the whole mount table"
        );
    }
}

/// Sixteen stages at once, in an agent allowed 256 open files. Every stage scans every mount
/// namespace, and each scan opened every namespace file any process held open, the other scans'
/// own included, before sorting out the ones it had read: side by side, the scans multiplied
/// each other's files, and an agent allowed 20,000 ran out of them at 128 volumes, concurrency
/// 16 (the bench): its stages were refused "in use" for a scan that failed. Seen failing before
/// the fix (32 volumes, 256 files: the first stages were refused).
#[tokio::test]
async fn sixteen_stages_at_once_fit_in_few_open_files() {
    if !require_root("sixteen_stages_at_once_fit_in_few_open_files") {
        return;
    }
    let scratch = Scratch::new("dense-fds");
    let mut agent = Agent::unstarted(&scratch, AgentOpts::default());
    agent.wrapper = vec!["prlimit".into(), "--nofile=256:256".into(), "--".into()];
    agent.spawn().await;
    let cap = mount_cap("ext4", Mode::SingleNodeWriter);
    let mut vols = Vec::new();
    for i in 0..32 {
        let vol = create_attached(&agent, &format!("fds-{i}"), 32 << 20).await;
        vols.push((vol, agent.work.join(format!("staging/fds-{i}"))));
    }
    for batch in vols.chunks(16) {
        let mut calls = tokio::task::JoinSet::new();
        for (vol, staging) in batch {
            let mut node = agent.node().await;
            let req = stage_req(vol, staging, cap.clone());
            calls.spawn(async move { node.node_stage_volume(req).await.map(|_| ()) });
        }
        while let Some(done) = calls.join_next().await {
            if let Err(status) = done.expect("a stage's task") {
                panic!("a stage among sixteen at once: {status:?}");
            }
        }
    }
    let mut node = agent.node().await;
    for (vol, staging) in &vols {
        node.node_unstage_volume(unstage_req(vol, staging))
            .await
            .unwrap();
    }
}
