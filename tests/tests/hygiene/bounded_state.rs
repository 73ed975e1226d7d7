//! The state file stays bounded when calls name volumes that never get anywhere: a stage that
//! fails before it changes anything on the host leaves no records of a volume nothing names.

use std::sync::Arc;

use ebs_tests::csi_req::*;
use ebs_tests::*;

use super::{MIB, fs_cap, write_and_unstage};

const UNKNOWN: usize = 500;

/// The ebs backend on an empty sysfs: no NVMe disk ever appears, so every stage ends in
/// resolve_device (the loop backend refuses unknown ids before any step).
fn ebs_node_without_disks(scratch: &Scratch) -> AgentOpts {
    let sys = scratch.join("sys");
    let dev = scratch.join("dev");
    std::fs::create_dir_all(sys.join("block")).unwrap();
    std::fs::create_dir_all(&dev).unwrap();
    let args = [
        "--backend",
        "ebs",
        "--mode",
        "node",
        "--node-id",
        "i-bounded",
        "--zone",
        "zone-1a",
        "--imds-disabled",
        "--device-wait",
        "1ms",
        "--sysfs-root",
        sys.to_str().unwrap(),
        "--dev-root",
        dev.to_str().unwrap(),
    ];
    AgentOpts {
        args: args.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

fn volumes_in(status: &serde_json::Value) -> Vec<serde_json::Value> {
    status["volumes"].as_array().cloned().unwrap_or_default()
}

#[tokio::test]
async fn stages_of_unknown_volumes_leave_the_state_file_bounded() {
    if !require_root("stages_of_unknown_volumes_leave_the_state_file_bounded") {
        return;
    }
    let scratch = Scratch::new("bounded-state");
    // A real volume with history: formatted, staged and unstaged by a loop agent.
    let mut agent = Agent::start(&scratch, AgentOpts::default()).await;
    let real = create_attached(&agent, "real", 64 * MIB).await;
    write_and_unstage(&agent, &real, &agent.work.join("stage-real"), "real").await;
    agent.terminate().await;
    let before = agent.status_json();
    let real_before = volumes_in(&before);
    assert_eq!(real_before.len(), 1, "{before:#}");
    let state_file = agent.state_dir.join("state.redb");
    let size_before = std::fs::metadata(&state_file).unwrap().len();

    // The same state under an ebs node agent, and a flood of stages for ids it never saw.
    agent.restart(Some(ebs_node_without_disks(&scratch))).await;
    let work = Arc::new(agent.work.clone());
    let node = agent.node().await;
    let mut calls = tokio::task::JoinSet::new();
    let mut codes = std::collections::BTreeMap::new();
    for i in 0..UNKNOWN {
        let mut node = node.clone();
        let work = Arc::clone(&work);
        calls.spawn(async move {
            let vol = Vol {
                id: format!("vol-{i:017x}"),
                device: "/dev/xvdba".into(),
            };
            let staging = work.join(format!("unknown-{i}"));
            node.node_stage_volume(stage_req(&vol, &staging, fs_cap()))
                .await
                .expect_err("no such disk")
                .code()
        });
        // At most 32 in flight.
        while calls.len() >= 32 || (i + 1 == UNKNOWN && !calls.is_empty()) {
            let code = calls.join_next().await.expect("a call").expect("joined");
            *codes.entry(format!("{code:?}")).or_insert(0) += 1;
        }
    }
    // Unstages and unpublishes of ids nobody staged answer OK and leave nothing either.
    let mut node = node;
    for i in 0..50 {
        let id = format!("vol-{:017x}", UNKNOWN + i);
        let path = work.join(format!("gone-{i}"));
        node.node_unstage_volume(csi::NodeUnstageVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: path.display().to_string(),
        })
        .await
        .expect("unstage of an unknown id");
        node.node_unpublish_volume(unpublish_by_id(&id, &path))
            .await
            .expect("unpublish of an unknown id");
    }
    drop(node);
    agent.terminate().await;

    let size_after = std::fs::metadata(&state_file).unwrap().len();
    eprintln!("state file {size_before} → {size_after} bytes after {UNKNOWN} failed stages");
    let after = agent.status_json();
    let listed = volumes_in(&after);
    assert_eq!(
        listed.len(),
        1,
        "status lists {} volumes after {UNKNOWN} failed stages ({codes:?})",
        listed.len()
    );
    assert_eq!(
        listed, real_before,
        "the real volume's records are untouched"
    );
    let size_after = std::fs::metadata(&state_file).unwrap().len();
    assert!(
        size_after <= size_before + (256 << 10),
        "state file {size_before} → {size_after} bytes after {UNKNOWN} failed stages"
    );
}
