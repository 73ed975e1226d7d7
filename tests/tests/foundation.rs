//! The foundation over the real socket: identity, the loop backend's controller cycle, start-up
//! refusals and shutdown.

use std::process::Command;
use std::time::Duration;

use ebs_tests::csi_req::*;
use ebs_tests::*;

use csi::volume_capability::access_mode::Mode;

#[tokio::test]
async fn identity_calls() {
    if !require_root("identity_calls") {
        return;
    }
    let scratch = Scratch::new("identity");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let mut id = agent.identity().await;
    let info = id
        .get_plugin_info(csi::GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "ebs.csi.aws.com");
    assert_eq!(info.vendor_version, env!("CARGO_PKG_VERSION"));
    let caps = id
        .get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(caps.capabilities.len(), 3);
    let probe = id.probe(csi::ProbeRequest {}).await.unwrap().into_inner();
    assert_eq!(probe.ready, Some(true));
    // The CLI client says the same.
    let (ok, v) = agent.client_json(&["identity", "info"]);
    assert!(ok);
    assert_eq!(v["name"], "ebs.csi.aws.com");
}

#[tokio::test]
async fn plugin_capabilities_are_the_same_in_every_mode() {
    if !require_root("plugin_capabilities_are_the_same_in_every_mode") {
        return;
    }
    let mut seen = Vec::new();
    for mode in ["all", "node", "controller"] {
        let scratch = Scratch::new(&format!("caps-{mode}"));
        let opts = AgentOpts {
            args: vec![
                "--backend".into(),
                "loop".into(),
                "--mode".into(),
                mode.into(),
            ],
            ..Default::default()
        };
        let agent = Agent::start(&scratch, opts).await;
        let caps = agent
            .identity()
            .await
            .get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {})
            .await
            .unwrap()
            .into_inner();
        seen.push(format!("{:?}", caps.capabilities));
    }
    assert!(seen.windows(2).all(|w| w[0] == w[1]), "{seen:?}");
}

#[tokio::test]
async fn loop_controller_cycle_is_idempotent() {
    if !require_root("loop_controller_cycle_is_idempotent") {
        return;
    }
    let scratch = Scratch::new("ctrl-cycle");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let mut c = agent.controller().await;
    let create = csi::CreateVolumeRequest {
        name: "pvc-one".into(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: 64 << 20,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![mount_cap("ext4", Mode::SingleNodeWriter)],
        parameters: [("fsType".to_string(), "xfs".to_string())].into(),
        ..Default::default()
    };
    let v1 = c
        .create_volume(create.clone())
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let v2 = c
        .create_volume(create.clone())
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(v1, v2, "CreateVolume twice gives the same volume");
    assert_eq!(v1.capacity_bytes, 64 << 20);
    assert_eq!(v1.volume_context["fsType"], "xfs");
    let mut bigger = create.clone();
    bigger.capacity_range = Some(csi::CapacityRange {
        required_bytes: 1 << 30,
        limit_bytes: 0,
    });
    let err = c.create_volume(bigger).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::AlreadyExists);

    let node = node_id(&agent).await;
    let publish = csi::ControllerPublishVolumeRequest {
        volume_id: v1.volume_id.clone(),
        node_id: node.clone(),
        volume_capability: Some(mount_cap("ext4", Mode::SingleNodeWriter)),
        ..Default::default()
    };
    let p1 = c
        .controller_publish_volume(publish.clone())
        .await
        .unwrap()
        .into_inner();
    let p2 = c
        .controller_publish_volume(publish.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(p1, p2);
    let dev = p1.publish_context["devicePath"].clone();
    let size = Command::new("blockdev")
        .args(["--getsize64", &dev])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&size.stdout).trim(),
        (64u64 << 20).to_string()
    );
    let name = dev.trim_start_matches("/dev/");
    assert!(std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file")).is_ok());

    let mut other = publish.clone();
    other.node_id = "some-other-node".into();
    assert_eq!(
        c.controller_publish_volume(other).await.unwrap_err().code(),
        tonic::Code::NotFound
    );

    let listed = c
        .list_volumes(csi::ListVolumesRequest {
            max_entries: 0,
            starting_token: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.entries.len(), 1);
    assert_eq!(
        listed.entries[0]
            .status
            .as_ref()
            .unwrap()
            .published_node_ids,
        vec![node.clone()]
    );

    let del = csi::DeleteVolumeRequest {
        volume_id: v1.volume_id.clone(),
        ..Default::default()
    };
    assert_eq!(
        c.delete_volume(del.clone()).await.unwrap_err().code(),
        tonic::Code::FailedPrecondition
    );

    let unpublish = csi::ControllerUnpublishVolumeRequest {
        volume_id: v1.volume_id.clone(),
        node_id: node.clone(),
        ..Default::default()
    };
    c.controller_unpublish_volume(unpublish.clone())
        .await
        .unwrap();
    c.controller_unpublish_volume(unpublish).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file")).is_ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "loop device still attached"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    c.delete_volume(del.clone()).await.unwrap();
    c.delete_volume(del).await.unwrap();
    let listed = c
        .list_volumes(csi::ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(listed.entries.is_empty());
}

#[tokio::test]
async fn list_volumes_pages_and_validate_capabilities() {
    if !require_root("list_volumes_pages_and_validate_capabilities") {
        return;
    }
    let scratch = Scratch::new("ctrl-list");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(create_volume(&agent, &format!("v{i}"), 8 << 20, &[]).await);
    }
    let mut c = agent.controller().await;
    let mut seen = Vec::new();
    let mut token = String::new();
    loop {
        let page = c
            .list_volumes(csi::ListVolumesRequest {
                max_entries: 2,
                starting_token: token.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(page.entries.len() <= 2);
        seen.extend(
            page.entries
                .iter()
                .map(|e| e.volume.as_ref().unwrap().volume_id.clone()),
        );
        if page.next_token.is_empty() {
            break;
        }
        token = page.next_token;
    }
    ids.sort();
    seen.sort();
    assert_eq!(ids, seen);
    let bad = c
        .list_volumes(csi::ListVolumesRequest {
            max_entries: 2,
            starting_token: "nope".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(bad.code(), tonic::Code::Aborted);

    let ok = c
        .validate_volume_capabilities(csi::ValidateVolumeCapabilitiesRequest {
            volume_id: ids[0].clone(),
            volume_capabilities: vec![mount_cap("xfs", Mode::SingleNodeWriter)],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(ok.confirmed.is_some());
    let no = c
        .validate_volume_capabilities(csi::ValidateVolumeCapabilitiesRequest {
            volume_id: ids[0].clone(),
            volume_capabilities: vec![mount_cap("ext4", Mode::MultiNodeMultiWriter)],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(no.confirmed.is_none() && !no.message.is_empty());
    let missing = c
        .validate_volume_capabilities(csi::ValidateVolumeCapabilitiesRequest {
            volume_id: "lv-missing".into(),
            volume_capabilities: vec![mount_cap("ext4", Mode::SingleNodeWriter)],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), tonic::Code::NotFound);
    let cap = c
        .get_capacity(csi::GetCapacityRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(cap.available_capacity > 0);
}

fn serve_output(args: &[&str]) -> std::process::Output {
    Command::new(agent_bin())
        .arg("serve")
        .args(args)
        .output()
        .expect("run agent")
}

#[test]
fn bad_endpoints_fail_fast_with_exit_code_2() {
    for ep in [
        "tcp://127.0.0.1:9000",
        "unix://relative.sock",
        "unix:///tmp/x/csi",
        "/tmp/x.sock",
    ] {
        let out = serve_output(&[
            "--backend",
            "loop",
            "--endpoint",
            ep,
            "--state-dir",
            "/nonexistent",
        ]);
        assert_eq!(out.status.code(), Some(2), "{ep}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("endpoint"), "{ep}: {err}");
    }
}

#[tokio::test]
async fn second_agent_on_same_socket_is_refused() {
    if !require_root("second_agent_on_same_socket_is_refused") {
        return;
    }
    let scratch = Scratch::new("two-agents");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let other_state = scratch.join("state2");
    let out = serve_output(&[
        "--backend",
        "loop",
        "--endpoint",
        &agent.endpoint(),
        "--state-dir",
        other_state.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("already serving"), "{err}");
    // The first agent still answers.
    agent
        .identity()
        .await
        .probe(csi::ProbeRequest {})
        .await
        .unwrap();
}

#[tokio::test]
async fn second_agent_on_same_state_dir_is_refused() {
    if !require_root("second_agent_on_same_state_dir_is_refused") {
        return;
    }
    let scratch = Scratch::new("two-states");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let sock = scratch.join("other.sock");
    let out = serve_output(&[
        "--backend",
        "loop",
        "--endpoint",
        &format!("unix://{}", sock.display()),
        "--state-dir",
        agent.state_dir.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("in use"));
}

#[test]
fn unwritable_state_dir_fails_fast() {
    let scratch = Scratch::new("unwritable");
    let state = unwritable_dir(&scratch);
    let sock = scratch.join("csi.sock");
    let out = serve_output(&[
        "--backend",
        "loop",
        "--endpoint",
        &format!("unix://{}", sock.display()),
        "--state-dir",
        state.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("state directory"), "{err}");
    assert!(!sock.exists(), "nothing is served");
}

#[tokio::test]
async fn sigterm_removes_the_socket_and_exits_zero() {
    if !require_root("sigterm_removes_the_socket_and_exits_zero") {
        return;
    }
    let scratch = Scratch::new("sigterm");
    let mut agent = Agent::start(&scratch, AgentOpts::default()).await;
    assert!(agent.socket.exists());
    let status = agent.terminate().await.expect("exits");
    assert!(status.success(), "{status}");
    assert!(!agent.socket.exists());
}

#[tokio::test]
async fn stale_socket_is_replaced() {
    if !require_root("stale_socket_is_replaced") {
        return;
    }
    let scratch = Scratch::new("stale");
    let mut agent = Agent::start(&scratch, AgentOpts::default()).await;
    agent.kill();
    assert!(agent.socket.exists(), "SIGKILL leaves the socket behind");
    agent.spawn().await;
    agent
        .identity()
        .await
        .probe(csi::ProbeRequest {})
        .await
        .unwrap();
}
