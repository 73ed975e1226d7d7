//! Hostile neighbours: an unprivileged local user floods the metrics port while the agent, under
//! systemd's default `ulimit -n 1024`, formats and mounts a volume. Host work must not run out
//! of descriptors, and the endpoint must answer again once the flood ends.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use csi::volume_capability::access_mode::Mode;
use ebs_tests::csi_req::*;
use ebs_tests::*;

/// nobody:nogroup on Debian.
const NOBODY: u32 = 65534;
const FLOOD_CONNECTIONS: usize = 1200;
const FLOOD_SECONDS: u64 = 10;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The agent started through `sh -c 'ulimit -n 1024; exec agent serve …'`: soft and hard limit
/// both 1024, as a systemd unit without LimitNOFILE has (soft) and raising cannot help.
async fn start_agent_with_1024_descriptors(scratch: &Scratch, metrics: &str) -> Agent {
    let mut agent = Agent::unstarted(scratch, AgentOpts::with_metrics(metrics));
    let log = std::fs::File::create(&agent.log).expect("log file");
    let child = Command::new("sh")
        .arg("-c")
        .arg("ulimit -n 1024 && exec \"$0\" \"$@\"")
        .arg(agent_bin())
        .args(agent.serve_args())
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("spawn agent");
    agent.child = Some(child);
    agent.wait_ready().await;
    agent
}

/// The flooder runs as nobody from a copy in the scratch directory (the build tree may lie
/// below a directory nobody cannot enter), with room for its own descriptors.
fn start_flood(scratch: &Scratch, addr: &str) -> std::process::Child {
    start_flooder(scratch, addr, FLOOD_CONNECTIONS, FLOOD_SECONDS, &[])
}

fn start_flooder(
    scratch: &Scratch,
    addr: &str,
    connections: usize,
    seconds: u64,
    extra: &[&str],
) -> std::process::Child {
    let copy = scratch.join("metrics_flood");
    std::fs::copy(env!("CARGO_BIN_EXE_metrics_flood"), &copy).expect("copy the flooder");
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
    let nofile = format!("--nofile={0}:{0}", connections + 512);
    Command::new("prlimit")
        .arg(nofile)
        .arg("--")
        .arg(&copy)
        .args([addr, &connections.to_string(), &seconds.to_string()])
        .args(extra)
        .uid(NOBODY)
        .gid(NOBODY)
        .current_dir("/")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the flooder")
}

fn max_open_files(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/limits"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap_or_default()
        .split_whitespace()
        .skip(3)
        .take(2)
        .collect::<Vec<_>>()
        .join(" ")
}

/// One GET; `None` while the endpoint does not answer.
fn try_get(addr: &str, path: &str) -> Option<String> {
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(3))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    text.starts_with("HTTP/1.1 ").then_some(text)
}

fn counter(body: &str, name: &str) -> f64 {
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} missing from:\n{body}"))
}

#[tokio::test]
async fn a_metrics_flood_by_an_unprivileged_user_starves_no_host_work() {
    if !require_root("a_metrics_flood_by_an_unprivileged_user_starves_no_host_work") {
        return;
    }
    let scratch = Scratch::new("flood");
    let addr = format!("127.0.0.1:{}", free_port());
    let agent = start_agent_with_1024_descriptors(&scratch, &addr).await;
    assert_eq!(max_open_files(agent.pid()), "1024 1024");
    let vol = create_attached(&agent, "flood", 64 << 20).await;
    let staging = agent.work.join("stage-flood");
    let target = agent.work.join("target-flood");
    std::fs::create_dir_all(&staging).unwrap();
    let mut node = agent.node().await;

    let mut flood = start_flood(&scratch, &addr);
    // Long enough for the flood to fill whatever the agent lets it fill.
    tokio::time::sleep(Duration::from_secs(3)).await;
    // The stage starts while the flood runs (how long it takes under load does not matter).
    let still_flooding = flood.try_wait().expect("flooder").is_none();
    let cap = mount_cap("ext4", Mode::SingleNodeWriter);
    let staged = tokio::time::timeout(
        Duration::from_secs(60),
        node.node_stage_volume(stage_req(&vol, &staging, cap.clone())),
    )
    .await
    .expect("stage in time");
    assert!(
        staged.is_ok(),
        "stage failed under the flood: {staged:?}\nagent log:\n{}",
        agent.log_text()
    );
    let published = node
        .node_publish_volume(publish_req(&vol, &staging, &target, cap, false))
        .await;
    assert!(published.is_ok(), "publish under the flood: {published:?}");
    assert!(still_flooding, "the flood ended before the stage began");

    let out = flood.wait_with_output().expect("flooder output");
    let report = String::from_utf8_lossy(&out.stdout);
    eprintln!("flood as uid {NOBODY}: {report}");
    let established: usize = report
        .split_whitespace()
        .find_map(|w| w.strip_prefix("established="))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| {
            panic!(
                "flooder said {report:?} {:?}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    assert!(
        established > FLOOD_CONNECTIONS,
        "the flood opened only {established} connections"
    );

    // Once the flood ends, the endpoint answers (slots free within the request timeout).
    let deadline = Instant::now() + Duration::from_secs(10);
    let answer = loop {
        if let Some(a) = try_get(&addr, "/metrics") {
            break a;
        }
        assert!(
            Instant::now() < deadline,
            "/metrics does not answer after the flood"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // The flood was pushed back: idle connections evicted for new ones at the cap (refused
    // only while every slot was answering). The request timeout is seen below.
    let pushed_back = counter(&answer, "ebs_agent_metrics_connections_refused_total")
        + counter(&answer, "ebs_agent_metrics_connections_evicted_total");
    assert!(pushed_back > 0.0, "{answer}");
    assert_eq!(counter(&answer, "ebs_agent_volumes_staged"), 1.0);
    assert!(
        agent.log_text().contains("open-file limit"),
        "the start-up log names the descriptor budget"
    );

    // A slowloris client is dropped at the request timeout (2 s), not after 5 s or never.
    let mut slow = std::net::TcpStream::connect(&addr).unwrap();
    slow.write_all(b"GET /metr").unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let started = Instant::now();
    let mut rest = Vec::new();
    let _ = slow.read_to_end(&mut rest);
    let held = started.elapsed();
    assert!(
        held < Duration::from_millis(3500),
        "a half-sent request held its connection {held:?}"
    );
    let answer = try_get(&addr, "/metrics").expect("a scrape after the slow client");
    assert!(counter(&answer, "ebs_agent_metrics_connections_timed_out_total") > 0.0);

    node.node_unpublish_volume(unpublish_req(&vol, &target))
        .await
        .expect("unpublish");
    node.node_unstage_volume(unstage_req(&vol, &staging))
        .await
        .expect("unstage");
}

/// About 200 half-sent requests (a head started, never ended) held by an unprivileged local
/// user, reopened as soon as the agent drops them: every scrape meanwhile is answered, in time.
/// Before the fix most scrapes failed: the half-sent connections filled the connection cap and
/// each new connection, the scrapes' included, was closed on accept.
#[tokio::test]
async fn half_sent_requests_by_a_local_user_leave_every_scrape_answered() {
    if !require_root("half_sent_requests_by_a_local_user_leave_every_scrape_answered") {
        return;
    }
    const HALF_SENT: usize = 250;
    const SCRAPES: usize = 20;
    let scratch = Scratch::new("half-sent");
    let addr = format!("127.0.0.1:{}", free_port());
    let _agent = start_agent_with_1024_descriptors(&scratch, &addr).await;
    let flood = start_flooder(&scratch, &addr, HALF_SENT, 15, &["half"]);
    // The flooder's own guard: killed by its PID if an assertion fails first.
    struct Reap(Option<std::process::Child>);
    impl Drop for Reap {
        fn drop(&mut self) {
            if let Some(mut c) = self.0.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
    let mut flood = Reap(Some(flood));
    tokio::time::sleep(Duration::from_secs(3)).await;

    let mut failed = Vec::new();
    for i in 0..SCRAPES {
        let started = Instant::now();
        let answer = tokio::task::spawn_blocking({
            let addr = addr.clone();
            move || try_get(&addr, "/metrics")
        })
        .await
        .unwrap();
        let took = started.elapsed();
        let first = answer
            .as_deref()
            .and_then(|a| a.lines().next())
            .map(str::to_string);
        if first.as_deref() != Some("HTTP/1.1 200 OK") || took > Duration::from_secs(2) {
            failed.push((i, took, first));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut child = flood.0.take().expect("flooder");
    let still_flooding = child.try_wait().expect("flooder").is_none();
    let out = child.wait_with_output().expect("flooder output");
    let report = String::from_utf8_lossy(&out.stdout);
    eprintln!("half-sent flood as uid {NOBODY}: {report}");
    assert!(still_flooding, "the flood ended before the scrapes did");
    assert!(
        failed.is_empty(),
        "{} of {SCRAPES} scrapes failed or took over 2 s under {HALF_SENT} half-sent requests: {failed:?}",
        failed.len()
    );
    let answer = try_get(&addr, "/metrics").expect("a scrape after the flood");
    assert!(counter(&answer, "ebs_agent_metrics_connections_evicted_total") > 0.0);
}
