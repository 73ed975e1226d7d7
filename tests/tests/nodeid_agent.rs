//! `serve --backend ebs --mode node` over the real socket: it serves without any identity source,
//! Probe and NodeGetInfo say which flag to set, a source that appears later is picked up without
//! a restart, and NodeGetInfo never fetches anything.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ebs_node_backends::nodeinfo::dmi;
use ebs_tests::imds::{Imds, Instance};
use ebs_tests::*;
use tonic::Code;

fn ebs_node(sysfs: &Path, extra: &[&str]) -> AgentOpts {
    let mut args: Vec<String> = [
        "--backend",
        "ebs",
        "--mode",
        "node",
        "--identity-retry-max",
        "100ms",
        "--imds-timeout",
        "300ms",
        "--sysfs-root",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.push(sysfs.display().to_string());
    args.extend(extra.iter().map(|s| s.to_string()));
    AgentOpts {
        args,
        env: Vec::new(),
        wait_ready: false,
    }
}

/// Polls Probe until `pred` holds on its answer (ready flag or error).
async fn probe_until(
    agent: &Agent,
    what: &str,
    pred: impl Fn(&Result<Option<bool>, tonic::Status>) -> bool,
) -> Result<Option<bool>, tonic::Status> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(ch) = channel(&agent.socket).await {
            let r = csi::identity_client::IdentityClient::new(ch)
                .probe(csi::ProbeRequest {})
                .await
                .map(|r| r.into_inner().ready);
            if pred(&r) {
                return r;
            }
        }
        assert!(
            Instant::now() < deadline,
            "Probe never became {what}; log:\n{}",
            agent.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn node_info(agent: &Agent) -> Result<csi::NodeGetInfoResponse, tonic::Status> {
    agent
        .node()
        .await
        .node_get_info(csi::NodeGetInfoRequest {})
        .await
        .map(|r| r.into_inner())
}

#[tokio::test]
async fn no_source_serves_with_a_hint_then_picks_up_imds_without_a_restart() {
    if !require_root("no_source_serves_with_a_hint_then_picks_up_imds_without_a_restart") {
        return;
    }
    let scratch = Scratch::new("nodeid-agent-late-imds");
    let sysfs = scratch.join("sys");
    std::fs::create_dir_all(&sysfs).unwrap();
    let imds = Imds::start(Instance::default()).await;
    imds.set(&imds.switches.hang_token, true);
    let endpoint = imds.endpoint();
    let agent = Agent::start(&scratch, ebs_node(&sysfs, &["--imds-endpoint", &endpoint])).await;

    let probe = probe_until(&agent, "FAILED_PRECONDITION", |r| r.is_err()).await;
    let status = probe.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert!(
        status.message().contains("--node-id"),
        "{}",
        status.message()
    );
    assert!(status.message().contains("--zone"), "{}", status.message());
    assert!(
        status.message().contains("hop limit"),
        "{}",
        status.message()
    );
    let err = node_info(&agent).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(err.message().contains("--node-id"), "{}", err.message());

    // IMDS starts answering: the background lookup finds it, no restart.
    imds.set(&imds.switches.hang_token, false);
    probe_until(&agent, "ready", |r| matches!(r, Ok(Some(true))))
        .await
        .unwrap();
    let info = node_info(&agent).await.unwrap();
    assert_eq!(info.node_id, "i-0feedfacecafe0001");
    let topo = info.accessible_topology.unwrap().segments;
    assert_eq!(topo["topology.ebs.csi.aws.com/zone"], "eu-central-1b");
    assert_eq!(topo["topology.kubernetes.io/zone"], "eu-central-1b");
    assert_eq!(topo["kubernetes.io/os"], "linux");
    // m5.large is not in the table: upstream's 27 shared - the root volume.
    assert_eq!(info.max_volumes_per_node, 26);

    // NodeGetInfo answers from memory: many calls, not one request reaches IMDS.
    let before = imds.requests();
    let mut node = agent.node().await;
    for _ in 0..200 {
        node.node_get_info(csi::NodeGetInfoRequest {})
            .await
            .unwrap();
    }
    assert_eq!(imds.requests(), before);
    assert!(
        agent.log_text().contains("attach limit"),
        "{}",
        agent.log_text()
    );
}

#[tokio::test]
async fn dmi_appearing_later_is_picked_up_and_flags_give_the_zone() {
    if !require_root("dmi_appearing_later_is_picked_up_and_flags_give_the_zone") {
        return;
    }
    let scratch = Scratch::new("nodeid-agent-late-dmi");
    let sysfs = scratch.join("sys");
    std::fs::create_dir_all(&sysfs).unwrap();
    let agent = Agent::start(
        &scratch,
        ebs_node(
            &sysfs,
            &[
                "--imds-disabled",
                "--zone",
                "us-east-2c",
                "--volume-attach-limit",
                "11",
            ],
        ),
    )
    .await;
    let status = probe_until(&agent, "FAILED_PRECONDITION", |r| r.is_err())
        .await
        .unwrap_err();
    assert!(
        status.message().contains("--node-id"),
        "{}",
        status.message()
    );
    assert!(
        !status.message().contains("--zone ("),
        "{}",
        status.message()
    );

    let tag = sysfs.join(dmi::ASSET_TAG);
    std::fs::create_dir_all(tag.parent().unwrap()).unwrap();
    std::fs::write(&tag, "i-0123456789abcdef0\n").unwrap();
    probe_until(&agent, "ready", |r| matches!(r, Ok(Some(true))))
        .await
        .unwrap();
    let info = node_info(&agent).await.unwrap();
    assert_eq!(info.node_id, "i-0123456789abcdef0");
    assert_eq!(
        info.accessible_topology.unwrap().segments["topology.kubernetes.io/zone"],
        "us-east-2c"
    );
    assert_eq!(info.max_volumes_per_node, 11);
}

#[tokio::test]
async fn flags_alone_serve_at_once_and_node_mode_reports_the_same_capabilities() {
    if !require_root("flags_alone_serve_at_once_and_node_mode_reports_the_same_capabilities") {
        return;
    }
    let scratch = Scratch::new("nodeid-agent-flags");
    let sysfs = scratch.join("sys");
    std::fs::create_dir_all(&sysfs).unwrap();
    let imds = Imds::start(Instance::default()).await;
    let endpoint = imds.endpoint();
    let mut opts = ebs_node(
        &sysfs,
        &[
            "--imds-endpoint",
            &endpoint,
            "--node-id",
            "i-0abcdef0123456789",
            "--zone",
            "sa-east-1a",
            "--instance-type",
            "c7i.48xlarge",
        ],
    );
    // No cloud credentials anywhere in its environment.
    opts.env
        .push(("HOME".into(), scratch.join("home").display().to_string()));
    opts.wait_ready = true;
    let agent = Agent::start(&scratch, opts).await;
    let info = node_info(&agent).await.unwrap();
    assert_eq!(info.node_id, "i-0abcdef0123456789");
    assert_eq!(
        info.max_volumes_per_node, 127,
        "dedicated 128 - the root volume"
    );
    assert_eq!(
        imds.asked(),
        ["outpost-arn"],
        "flags said everything: IMDS is asked only whether this is an Outpost"
    );
    assert_eq!(imds.switches.token_requests.load(Ordering::SeqCst), 1);

    let caps = agent
        .identity()
        .await
        .get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities;
    let expected = ebs_node_agent::grpc::identity::plugin_capabilities();
    assert_eq!(format!("{caps:?}"), format!("{expected:?}"));
}
