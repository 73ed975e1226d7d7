//! CSI v0.3 and v0.1 refusals: version negotiation, missing and bad fields (the codes each spec
//! names, nothing left on the host), and `--csi-versions` turning versions off.

// NodeGetId is deprecated by the v0.3 spec itself; v0.3 plugins must still serve it.
#![allow(deprecated)]

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use ebs_tests::legacy::*;
use ebs_tests::*;

use tonic::Code;

#[tokio::test]
async fn legacy_error_codes() {
    let scratch = Scratch::new("csi-v0-errors");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;

    // v0.1 version negotiation.
    let mut id01 = v01_identity(&agent).await;
    let versions = id01
        .get_supported_versions(v01::GetSupportedVersionsRequest {})
        .await
        .unwrap()
        .into_inner()
        .supported_versions;
    assert_eq!(versions, [V01]);
    let bad = v01::Version {
        major: 0,
        minor: 2,
        patch: 0,
    };
    for version in [Some(bad), None] {
        let e = id01
            .get_plugin_info(v01::GetPluginInfoRequest { version })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    }
    let info = id01
        .get_plugin_info(v01::GetPluginInfoRequest {
            version: v01_version(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "ebs.csi.aws.com");

    let mut n01 = v01_node(&agent).await;
    let target = agent.work.join("pods/bad/mount");
    let info = HashMap::new();
    // A volume that exists, so the path checks are reached (an unknown one is NOT_FOUND first).
    let known = ebs_tests::csi_req::create_volume(&agent, "refusals", 16 << 20, &[]).await;
    let mut wrong = v01_publish("vol-x", &info, &target, "ext4");
    wrong.version = Some(bad);
    let mut cases = vec![
        ("bad version", wrong, Code::InvalidArgument),
        (
            "no target",
            v01_publish("vol-x", &info, Path::new(""), "ext4"),
            Code::InvalidArgument,
        ),
        (
            "no volume id",
            v01_publish("", &info, &target, "ext4"),
            Code::InvalidArgument,
        ),
        (
            "dot-dot volume id",
            v01_publish("..", &info, &target, "ext4"),
            Code::InvalidArgument,
        ),
        (
            "target outside the allowed roots",
            v01_publish(&known, &info, Path::new("/etc/evil"), "ext4"),
            Code::InvalidArgument,
        ),
        (
            "unknown volume, before its path",
            v01_publish("vol-x", &info, Path::new("/etc/evil"), "ext4"),
            Code::NotFound,
        ),
    ];
    let mut no_cap = v01_publish("vol-x", &info, &target, "ext4");
    no_cap.volume_capability = None;
    cases.push(("no capability", no_cap, Code::InvalidArgument));
    for (what, req, code) in cases {
        let e = n01.node_publish_volume(req).await.unwrap_err();
        assert_eq!(e.code(), code, "{what}: {e:?}");
    }
    let mut unpub = v01_unpublish("vol-x", &target);
    unpub.version = None;
    let e = n01.node_unpublish_volume(unpub).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(!target.exists(), "refusals leave nothing behind");
    assert!(!agent.state_dir.join("v01-staging/vol-x").exists());

    // v0.1 probes and capabilities.
    n01.node_probe(v01::NodeProbeRequest {
        version: v01_version(),
    })
    .await
    .unwrap();
    let mut c01 = v01_controller(&agent).await;
    c01.controller_probe(v01::ControllerProbeRequest {
        version: v01_version(),
    })
    .await
    .unwrap();
    let caps = c01
        .controller_get_capabilities(v01::ControllerGetCapabilitiesRequest {
            version: v01_version(),
        })
        .await
        .unwrap()
        .into_inner()
        .capabilities;
    assert_eq!(
        caps.len(),
        4,
        "create/delete, publish, list, capacity: {caps:?}"
    );
    let e = c01
        .get_capacity(v01::GetCapacityRequest::default())
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "no version");
    let e = c01
        .create_volume(v01::CreateVolumeRequest {
            version: v01_version(),
            name: "huge".into(),
            capacity_range: Some(v01::CapacityRange {
                required_bytes: u64::MAX,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![v01_mount_cap("ext4")],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");

    // v0.3: the v1 codes, under v0 names.
    let mut id0 = v0_identity(&agent).await;
    let probe = id0.probe(v0::ProbeRequest {}).await.unwrap().into_inner();
    assert_eq!(probe.ready, Some(true));
    let caps = id0
        .get_plugin_capabilities(v0::GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities;
    assert_eq!(caps.len(), 2, "controller service, accessibility: {caps:?}");
    let mut n0 = v0_node(&agent).await;
    let staging = agent.work.join("staging/bad");
    let e = n0
        .node_stage_volume(v0_stage("", &info, &staging, "ext4"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    let mut no_cap = v0_stage("vol-x", &info, &staging, "ext4");
    no_cap.volume_capability = None;
    let e = n0.node_stage_volume(no_cap).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    let e = n0
        .node_publish_volume(v0_publish(&known, &info, Path::new(""), &target, "ext4"))
        .await
        .unwrap_err();
    assert_eq!(
        e.code(),
        Code::FailedPrecondition,
        "v0.3: staging target path not set: {e:?}"
    );
    assert!(!staging.exists() && !target.exists());
}

/// Waits until the v0.1 NodeProbe answers (for an agent that serves no v1 Probe).
async fn wait_v01_ready(agent: &Agent) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(ch) = channel(&agent.socket).await {
            let mut n = v01::node_client::NodeClient::new(ch);
            if n.node_probe(v01::NodeProbeRequest {
                version: v01_version(),
            })
            .await
            .is_ok()
            {
                return;
            }
        }
        assert!(Instant::now() < deadline, "{}", agent.log_text());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn csi_versions_turn_versions_off() {
    let scratch = Scratch::new("csi-v0-only-v1");
    let mut opts = AgentOpts::default();
    opts.args.extend(["--csi-versions".into(), "v1".into()]);
    let agent = Agent::start(&scratch, opts).await;
    let e = v0_identity(&agent)
        .await
        .probe(v0::ProbeRequest {})
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unimplemented);
    let e = v0_node(&agent)
        .await
        .node_get_info(v0::NodeGetInfoRequest {})
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unimplemented);
    let e = v01_identity(&agent)
        .await
        .get_supported_versions(v01::GetSupportedVersionsRequest {})
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unimplemented);
    drop(agent);

    // Only v0.1, through the environment as a Mesos 1.5 task would set it.
    let scratch = Scratch::new("csi-v0-only-v01");
    let opts = AgentOpts {
        env: vec![("EBS_AGENT_CSI_VERSIONS".into(), "v0.1".into())],
        wait_ready: false,
        ..AgentOpts::default()
    };
    let agent = Agent::start(&scratch, opts).await;
    wait_v01_ready(&agent).await;
    let e = agent
        .identity()
        .await
        .probe(csi::ProbeRequest {})
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unimplemented);
    let e = v0_node(&agent)
        .await
        .node_get_id(v0::NodeGetIdRequest {})
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unimplemented);
}
