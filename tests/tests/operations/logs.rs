//! Logs: one line per call, JSON on request, and never a secret.

use ebs_tests::csi_req::*;
use ebs_tests::*;

use csi::volume_capability::access_mode::Mode;

const SECRET: &str = "hunter2-SECRET";

#[tokio::test]
async fn secrets_never_reach_the_logs_and_json_logs_have_one_line_per_call() {
    if !require_root("secrets_never_reach_the_logs_and_json_logs_have_one_line_per_call") {
        return;
    }
    let scratch = Scratch::new("secrets");
    let opts = AgentOpts {
        args: vec![
            "--backend".into(),
            "loop".into(),
            "--log-format".into(),
            "json".into(),
        ],
        ..Default::default()
    };
    let agent = Agent::start(&scratch, opts).await;
    let secrets = || {
        [("password".to_string(), SECRET.to_string())]
            .into_iter()
            .collect()
    };
    let created = agent
        .controller()
        .await
        .create_volume(csi::CreateVolumeRequest {
            name: "sec1".into(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: 64 << 20,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![mount_cap("ext4", Mode::SingleNodeWriter)],
            secrets: secrets(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let vol = attach(&agent, &created.volume.unwrap().volume_id).await;
    let staging = agent.work.join("stage-sec1");
    let target = agent.work.join("target-sec1");
    std::fs::create_dir_all(&staging).unwrap();
    let cap = mount_cap("ext4", Mode::SingleNodeWriter);
    let mut stage = stage_req(&vol, &staging, cap.clone());
    stage.secrets = secrets();
    agent
        .node()
        .await
        .node_stage_volume(stage.clone())
        .await
        .unwrap();
    let mut publish = publish_req(&vol, &staging, &target, cap, false);
    publish.secrets = secrets();
    agent
        .node()
        .await
        .node_publish_volume(publish)
        .await
        .unwrap();
    // A refused call that carried secrets: its error line must not echo them either.
    stage.volume_capability = None;
    assert!(agent.node().await.node_stage_volume(stage).await.is_err());

    let log = agent.log_text();
    assert!(
        !log.contains(SECRET) && !log.contains("hunter2"),
        "secret in the log:\n{log}"
    );

    let mut calls = Vec::new();
    for line in log.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        if v["rpc"].is_string() {
            assert!(v["volume"].is_string(), "{line}");
            assert!(v["ms"].is_number(), "{line}");
            calls.push(format!(
                "{} {}",
                v["rpc"].as_str().unwrap(),
                v["level"].as_str().unwrap_or("")
            ));
        }
    }
    let stages = calls
        .iter()
        .filter(|c| c.starts_with("NodeStageVolume"))
        .count();
    assert_eq!(stages, 2, "one line per call: {calls:?}");
    assert!(
        calls.iter().any(|c| c == "NodeStageVolume WARN"),
        "{calls:?}"
    );
    assert_eq!(
        calls
            .iter()
            .filter(|c| c.starts_with("NodePublishVolume"))
            .count(),
        1
    );
}
