//! The Prometheus endpoint: families, values after a lifecycle, and a busy address refused at start.

use std::time::Duration;

use ebs_tests::http::{free_port, http_get, sample};
use ebs_tests::*;

use super::stage_and_publish;

#[tokio::test]
async fn metrics_after_a_stage_publish_cycle() {
    if !require_root("metrics_after_a_stage_publish_cycle") {
        return;
    }
    let scratch = Scratch::new("metrics");
    let port = free_port();
    let opts = AgentOpts::with_metrics(format!("127.0.0.1:{port}"));
    let agent = Agent::start(&scratch, opts).await;
    let (vol, staging, _target) = stage_and_publish(&agent, "m1").await;
    // One refused call, for the error-code label.
    let bad = agent
        .node()
        .await
        .node_publish_volume(csi::NodePublishVolumeRequest {
            volume_id: vol.id.clone(),
            staging_target_path: staging.display().to_string(),
            ..Default::default()
        })
        .await;
    assert_eq!(bad.unwrap_err().code(), tonic::Code::InvalidArgument);

    let (head, body) = http_get(port, "/metrics");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.contains("Content-Type: text/plain; version=0.0.4"),
        "{head}"
    );

    for rpc in [
        "CreateVolume",
        "ControllerPublishVolume",
        "NodeStageVolume",
        "NodePublishVolume",
    ] {
        assert_eq!(
            sample(
                &body,
                &format!("ebs_agent_rpc_requests_total{{code=\"OK\",rpc=\"{rpc}\"}}")
            ),
            1.0
        );
        let h = format!(
            "ebs_agent_rpc_duration_seconds_bucket{{code=\"OK\",rpc=\"{rpc}\",le=\"+Inf\"}}"
        );
        assert_eq!(sample(&body, &h), 1.0);
        let sum = format!("ebs_agent_rpc_duration_seconds_sum{{code=\"OK\",rpc=\"{rpc}\"}}");
        assert!(sample(&body, &sum) > 0.0);
    }
    assert_eq!(
        sample(
            &body,
            "ebs_agent_rpc_requests_total{code=\"InvalidArgument\",rpc=\"NodePublishVolume\"}"
        ),
        1.0
    );
    // Host steps of the stage and the publish, each timed from intent to done.
    for (op, step) in [
        ("stage", "probe"),
        ("stage", "format"),
        ("stage", "mount"),
        ("publish", "bind"),
    ] {
        let count = format!(
            "ebs_agent_step_duration_seconds_count{{op=\"{op}\",result=\"ok\",step=\"{step}\"}}"
        );
        assert_eq!(sample(&body, &count), 1.0, "{op}.{step}");
    }
    // Buckets are cumulative and end at the count.
    let buckets: Vec<f64> = body
        .lines()
        .filter(|l| {
            l.starts_with(
                "ebs_agent_step_duration_seconds_bucket{op=\"stage\",result=\"ok\",step=\"format\"",
            )
        })
        .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
        .collect();
    assert!(
        buckets.len() > 5 && buckets.windows(2).all(|w| w[0] <= w[1]),
        "{buckets:?}"
    );
    assert_eq!(*buckets.last().unwrap(), 1.0);
    assert!(
        sample(
            &body,
            "ebs_agent_journal_commit_seconds_count{durability=\"immediate\"}"
        ) >= 2.0
    );
    assert!(
        sample(
            &body,
            "ebs_agent_journal_commit_seconds_count{durability=\"lazy\"}"
        ) >= 1.0
    );
    assert_eq!(sample(&body, "ebs_agent_volumes_staged"), 1.0);
    assert_eq!(sample(&body, "ebs_agent_volumes_published"), 1.0);
    assert_eq!(sample(&body, "ebs_agent_operations_in_flight"), 0.0);
    assert_eq!(sample(&body, "ebs_agent_ready"), 1.0);
    for family in [
        "ebs_agent_rpc_requests_total counter",
        "ebs_agent_rpc_duration_seconds histogram",
        "ebs_agent_step_duration_seconds histogram",
        "ebs_agent_journal_commit_seconds histogram",
        "ebs_agent_volumes_staged gauge",
    ] {
        assert!(body.contains(&format!("# TYPE {family}\n")), "{family}");
    }

    let (head, _) = http_get(port, "/other");
    assert!(head.starts_with("HTTP/1.1 404"), "{head}");
}

#[tokio::test]
async fn metrics_address_in_use_stops_the_start_without_a_socket() {
    if !require_root("metrics_address_in_use_stops_the_start_without_a_socket") {
        return;
    }
    let scratch = Scratch::new("metrics-busy");
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    let opts = AgentOpts {
        wait_ready: false,
        ..AgentOpts::with_metrics(addr.clone())
    };
    let mut agent = Agent::start(&scratch, opts).await;
    let status = agent
        .wait_exit(Duration::from_secs(20))
        .await
        .expect("agent exits");
    assert!(!status.success());
    assert!(
        agent
            .log_text()
            .contains(&format!("--metrics-address {addr}")),
        "{}",
        agent.log_text()
    );
    assert!(!agent.socket.exists());
}
