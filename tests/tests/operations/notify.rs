//! systemd's notify protocol: READY=1 after recovery, STOPPING=1 on SIGTERM.

use std::time::{Duration, Instant};

use ebs_tests::*;

use super::stage_and_publish;

#[tokio::test]
async fn sd_notify_ready_after_recovery_and_stopping_on_sigterm() {
    if !require_root("sd_notify_ready_after_recovery_and_stopping_on_sigterm") {
        return;
    }
    let scratch = Scratch::new("notify");
    let mut agent = Agent::start(&scratch, AgentOpts::default()).await;
    // Something for start-up recovery to check: a staged, published volume, then a crash.
    stage_and_publish(&agent, "n1").await;
    agent.kill();

    let notify_path = scratch.join("notify.sock");
    let notify = tokio::net::UnixDatagram::bind(&notify_path).unwrap();
    let opts = AgentOpts {
        env: vec![
            ("NOTIFY_SOCKET".into(), notify_path.display().to_string()),
            ("WATCHDOG_USEC".into(), "200000".into()),
        ],
        wait_ready: false,
        ..Default::default()
    };
    agent.restart(Some(opts)).await;
    async fn recv(sock: &tokio::net::UnixDatagram) -> String {
        let mut buf = [0u8; 512];
        let n = tokio::time::timeout(Duration::from_secs(30), sock.recv(&mut buf))
            .await
            .expect("a notify message in time")
            .unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }
    let first = recv(&notify).await;
    assert!(first.lines().any(|l| l == "READY=1"), "{first}");
    assert!(
        first.contains(&format!("MAINPID={}", agent.pid())),
        "{first}"
    );
    // READY=1 came after recovery: its log line is written, and Probe already says ready.
    let log = agent.log_text();
    assert!(
        log.contains("start-up recovery done") && log.contains("volumes=1"),
        "{log}"
    );
    let probe = agent
        .identity()
        .await
        .probe(csi::ProbeRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(probe.ready, Some(true));

    // The watchdog is fed (at half of WATCHDOG_USEC), then SIGTERM brings STOPPING=1.
    let watchdog = recv(&notify).await;
    assert_eq!(watchdog, "WATCHDOG=1");
    let pid = nix::unistd::Pid::from_raw(agent.pid() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let msg = recv(&notify).await;
        if msg == "STOPPING=1" {
            break;
        }
        assert_eq!(msg, "WATCHDOG=1", "unexpected notify message");
        assert!(Instant::now() < deadline, "no STOPPING=1");
    }
    let status = agent
        .wait_exit(Duration::from_secs(20))
        .await
        .expect("exits");
    assert!(status.success());
}
