//! The Controller shim of the ebs backend over a unix socket: every Controller call forwarded to a
//! stand-in upstream controller, errors and deadlines passed through, no head-of-line blocking,
//! recovery after the upstream restarts, and node mode without any upstream.

use std::time::{Duration, Instant};

use ebs_tests::controller_cases::*;
use ebs_tests::fake_controller::FakeController;
use ebs_tests::*;

use csi::controller_client::ControllerClient;
use tonic::transport::Channel;
use tonic::{Code, Request};

#[tokio::test]
async fn every_controller_rpc_is_forwarded_unchanged_over_a_unix_socket() {
    let scratch = Scratch::new("shim-unix");
    let fake = FakeController::default();
    let sock = scratch.join("upstream.sock");
    let _served = fake.serve_unix(&sock);
    let agent = Agent::start(&scratch, shim_opts(&unix_url(&sock), &[])).await;
    let mut client = agent.controller().await;
    check_all_rpcs(&mut client, &fake).await;
    let log = agent.log_text();
    assert!(!log.contains(SECRET), "a secret reached the log:\n{log}");
    assert!(
        log.contains("ControllerModifyVolume"),
        "one line per call:\n{log}"
    );
}

#[tokio::test]
async fn upstream_errors_come_back_unchanged() {
    let scratch = Scratch::new("shim-errors");
    let fake = FakeController::default();
    let sock = scratch.join("upstream.sock");
    let _served = fake.serve_unix(&sock);
    let agent = Agent::start(&scratch, shim_opts(&unix_url(&sock), &[])).await;
    let mut client = agent.controller().await;
    let cases = [
        (
            Code::ResourceExhausted,
            "volume quota reached: 5000 of 5000 gp3 volumes",
        ),
        (Code::NotFound, "volume vol-0abc not found"),
        (Code::Aborted, "an operation on vol-0abc is pending"),
        (
            Code::FailedPrecondition,
            "volume is attached to i-0fff ünïcödé",
        ),
    ];
    for (code, message) in cases {
        fake.fail("DeleteVolume", code, message);
        let err = client
            .delete_volume(csi::DeleteVolumeRequest {
                volume_id: "vol-0abc".into(),
                secrets: secrets(),
            })
            .await
            .unwrap_err();
        assert_eq!((err.code(), err.message()), (code, message));
        assert_eq!(err.details(), format!("details: {message}").as_bytes());
        assert_eq!(err.metadata().get("x-upstream-error").unwrap(), "1");
    }
    // An upstream answer is not a broken link: the next call is forwarded at once.
    fake.fail("DeleteVolume", Code::Unavailable, "EC2 API throttled");
    let before = fake.count();
    for _ in 0..3 {
        let err = client
            .delete_volume(csi::DeleteVolumeRequest::default())
            .await
            .unwrap_err();
        assert_eq!(
            (err.code(), err.message()),
            (Code::Unavailable, "EC2 API throttled")
        );
    }
    assert_eq!(fake.count(), before + 3);
}

#[tokio::test]
async fn the_callers_deadline_reaches_the_upstream_and_calls_do_not_queue() {
    let scratch = Scratch::new("shim-deadline");
    let fake = FakeController::default();
    let sock = scratch.join("upstream.sock");
    let _served = fake.serve_unix(&sock);
    let agent = Agent::start(&scratch, shim_opts(&unix_url(&sock), &[])).await;
    let mut client = agent.controller().await;
    fake.delay("CreateVolume", Duration::from_secs(5));

    let mut call = Request::new(csi::CreateVolumeRequest {
        name: "slow".into(),
        ..Default::default()
    });
    call.set_timeout(Duration::from_millis(400));
    let started = Instant::now();
    let err = client.create_volume(call).await.unwrap_err();
    let took = started.elapsed();
    assert!(
        matches!(err.code(), Code::DeadlineExceeded | Code::Cancelled),
        "{err:?}"
    );
    assert!(
        took < Duration::from_secs(3),
        "the deadline was not kept: {took:?}"
    );
    let (_, md) = fake
        .last::<csi::CreateVolumeRequest>("CreateVolume")
        .expect("forwarded");
    let upstream_timeout = md
        .get("grpc-timeout")
        .expect("the upstream saw no deadline")
        .to_str()
        .unwrap()
        .to_string();
    let (n, unit) = upstream_timeout.split_at(upstream_timeout.len() - 1);
    let n: u64 = n.parse().unwrap();
    let seen = match unit {
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        "S" => Duration::from_secs(n),
        other => panic!("unexpected unit {other}"),
    };
    assert!(
        seen > Duration::ZERO && seen <= Duration::from_millis(400),
        "upstream deadline {upstream_timeout}"
    );

    // A slow call does not hold up the others (no head-of-line blocking).
    let mut slow_client = client.clone();
    let slow = tokio::spawn(async move {
        let mut call = Request::new(csi::CreateVolumeRequest::default());
        call.set_timeout(Duration::from_secs(3));
        slow_client.create_volume(call).await
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    for _ in 0..20 {
        client
            .controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
            .await
            .expect("fast call");
    }
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "fast calls waited behind the slow one: {:?}",
        started.elapsed()
    );
    slow.abort();
}

async fn call_until_ok(
    client: &mut ControllerClient<Channel>,
    within: Duration,
) -> Vec<tonic::Status> {
    let deadline = Instant::now() + within;
    let mut errors = Vec::new();
    loop {
        match client
            .controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
            .await
        {
            Ok(_) => return errors,
            Err(e) => errors.push(e),
        }
        assert!(Instant::now() < deadline, "no recovery; errors: {errors:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn an_upstream_that_is_down_or_restarts_is_recovered_without_restarting_the_agent() {
    let scratch = Scratch::new("shim-restart");
    let fake = FakeController::default();
    let sock = scratch.join("upstream.sock");
    // The agent starts while the upstream is not there yet: it starts and serves anyway.
    let agent = Agent::start(&scratch, shim_opts(&unix_url(&sock), &[])).await;
    let mut client = agent.controller().await;
    let err = client
        .controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert!(
        err.message().contains("controller upstream") && err.message().contains("unreachable"),
        "{}",
        err.message()
    );
    let probe = agent
        .identity()
        .await
        .probe(csi::ProbeRequest {})
        .await
        .unwrap();
    assert_eq!(
        probe.into_inner().ready,
        Some(true),
        "Probe must not depend on the upstream"
    );

    let served = fake.serve_unix(&sock);
    call_until_ok(&mut client, Duration::from_secs(10)).await;

    // Restart mid-test.
    served.stop().await;
    let err = client
        .controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    let _served = fake.serve_unix(&sock);
    let started = Instant::now();
    call_until_ok(&mut client, Duration::from_secs(10)).await;
    eprintln!(
        "recovered {:?} after the upstream came back",
        started.elapsed()
    );
    // Everything works again, with fields intact.
    check_all_rpcs(&mut client, &fake).await;

    let log = agent.log_text();
    assert!(log.contains("node operations do not need it"), "{log}");
    assert!(log.contains("reachable again"), "{log}");
}

/// A CA and leaf certificates, written under the scratch directory as PEM files.
#[tokio::test]
async fn node_mode_has_no_controller_and_needs_no_upstream() {
    if !require_root("node_mode_has_no_controller_and_needs_no_upstream") {
        return;
    }
    let scratch = Scratch::new("shim-node");
    let opts = AgentOpts {
        args: vec![
            "--backend".into(),
            "ebs".into(),
            "--mode".into(),
            "node".into(),
            // A complete node identity without instance metadata (none here).
            "--node-id".into(),
            "i-0123456789abcdef0".into(),
            "--zone".into(),
            "test-zone-1a".into(),
            "--imds-disabled".into(),
        ],
        ..Default::default()
    };
    let agent = Agent::start(&scratch, opts).await;
    let err = agent
        .controller()
        .await
        .controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented, "{err:?}");
    let err = agent
        .controller()
        .await
        .create_volume(csi::CreateVolumeRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented, "{err:?}");
    let caps = agent
        .node()
        .await
        .node_get_capabilities(csi::NodeGetCapabilitiesRequest {})
        .await
        .expect("node service");
    assert!(!caps.into_inner().capabilities.is_empty());
    let probe = agent
        .identity()
        .await
        .probe(csi::ProbeRequest {})
        .await
        .unwrap();
    assert_eq!(probe.into_inner().ready, Some(true));
}

#[tokio::test]
async fn all_mode_stays_ready_for_node_work_while_the_upstream_is_down() {
    if !require_root("all_mode_stays_ready_for_node_work_while_the_upstream_is_down") {
        return;
    }
    let scratch = Scratch::new("shim-all-down");
    let sock = scratch.join("nobody-listens.sock");
    let opts = AgentOpts {
        args: vec![
            "--backend".into(),
            "ebs".into(),
            "--mode".into(),
            "all".into(),
            // A complete node identity without instance metadata (none here).
            "--node-id".into(),
            "i-0123456789abcdef0".into(),
            "--zone".into(),
            "test-zone-1a".into(),
            "--imds-disabled".into(),
            "--controller-upstream".into(),
            unix_url(&sock),
        ],
        ..Default::default()
    };
    let agent = Agent::start(&scratch, opts).await;
    let probe = agent
        .identity()
        .await
        .probe(csi::ProbeRequest {})
        .await
        .unwrap();
    assert_eq!(probe.into_inner().ready, Some(true));
    agent
        .node()
        .await
        .node_get_capabilities(csi::NodeGetCapabilitiesRequest {})
        .await
        .expect("node work goes on");
    let err = agent
        .controller()
        .await
        .create_volume(csi::CreateVolumeRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    // The start-up check says so in the log, once.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !agent.log_text().contains("node operations do not need it") {
        assert!(Instant::now() < deadline, "{}", agent.log_text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        agent
            .log_text()
            .matches("controller upstream unreachable")
            .count(),
        1
    );
}
