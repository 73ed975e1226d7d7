//! Start-up recovery per volume (issue 31, item 4): a record that cannot be checked marks only its
//! own volume "needs attention". The agent gets ready, every other volume works, `status` names
//! the bad volume and why, calls on it get FAILED_PRECONDITION naming the reason, and once the
//! operator fixes the cause a retried call (or the background retry) clears the mark.
//! Its own test binary: the dead-mount case must not have other tests walk into its FUSE mount.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use csi::volume_capability::access_mode::Mode;
use ebs_tests::csi_req::*;
use ebs_tests::hung_mount::HungMount;
use ebs_tests::*;
use tonic::Code;

struct Published {
    vol: Vol,
    staging: PathBuf,
    target: PathBuf,
}

fn cap() -> csi::VolumeCapability {
    mount_cap("ext4", Mode::SingleNodeWriter)
}

/// Stages and publishes a fresh 64 MiB ext4 volume and writes its name into it.
async fn publish(agent: &Agent, name: &str, target: PathBuf) -> Published {
    let vol = create_attached(agent, name, 64 << 20).await;
    let staging = agent.work.join(format!("staging/{name}"));
    let mut node = agent.node().await;
    node.node_stage_volume(stage_req(&vol, &staging, cap()))
        .await
        .expect("stage");
    node.node_publish_volume(publish_req(&vol, &staging, &target, cap(), false))
        .await
        .expect("publish");
    std::fs::write(target.join("data.txt"), name.as_bytes()).expect("write through target");
    Published {
        vol,
        staging,
        target,
    }
}

fn is_mounted(path: &Path) -> bool {
    mounts_below(path).iter().any(|m| m == path)
}

async fn unpublish(agent: &Agent, p: &Published) -> Result<(), tonic::Status> {
    let mut node = agent.node().await;
    node.node_unpublish_volume(unpublish_req(&p.vol, &p.target))
        .await
        .map(drop)
}

async fn unstage(agent: &Agent, p: &Published) -> Result<(), tonic::Status> {
    let mut node = agent.node().await;
    node.node_unstage_volume(unstage_req(&p.vol, &p.staging))
        .await
        .map(drop)
}

/// Unpublishes and unstages a volume whose data must still read back, then stages it again to
/// read the data from the device itself, and unstages.
async fn take_down_and_check(agent: &Agent, p: &Published, name: &str) {
    assert_eq!(
        std::fs::read(p.target.join("data.txt")).expect("read through target"),
        name.as_bytes()
    );
    unpublish(agent, p).await.expect("unpublish");
    assert!(
        !is_mounted(&p.target),
        "{} still mounted",
        p.target.display()
    );
    unstage(agent, p).await.expect("unstage");
    assert!(!is_mounted(&p.staging));
    let mut node = agent.node().await;
    node.node_stage_volume(stage_req(&p.vol, &p.staging, cap()))
        .await
        .expect("stage again");
    assert_eq!(
        std::fs::read(p.staging.join("data.txt")).expect("read from the device"),
        name.as_bytes()
    );
    unstage(agent, p).await.expect("unstage again");
    assert!(!is_mounted(&p.staging));
}

/// `status` (text and JSON) from the running agent shows the volume as needing attention, with
/// a reason containing `why`.
fn assert_status_names(agent: &Agent, vol: &str, why: &str) {
    let v = agent.status_json();
    let entry = v["volumes"]
        .as_array()
        .and_then(|a| a.iter().find(|e| e["volume_id"] == vol))
        .unwrap_or_else(|| panic!("{vol} not in status: {v}"));
    let reason = entry["needs_attention"]["reason"].as_str().unwrap_or("");
    assert!(reason.contains(why), "status --json: {entry}");
    let out = std::process::Command::new(agent_bin())
        .args(["status", "--endpoint", &agent.endpoint(), "--state-dir"])
        .arg(&agent.state_dir)
        .output()
        .expect("status");
    let text = String::from_utf8_lossy(&out.stdout);
    let block = text
        .split("\n\n")
        .find(|b| b.contains(&format!("volume {vol}\n")))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(block.contains("needs attention"), "{block}");
    assert!(block.contains(why), "{block}");
}

fn assert_no_mark(agent: &Agent) {
    let v = agent.status_json();
    for e in v["volumes"].as_array().into_iter().flatten() {
        assert!(e["needs_attention"].is_null(), "{e}");
    }
}

/// The clear refusal for a volume that needs attention, naming `why`, at once.
async fn assert_refused(agent: &Agent, p: &Published, why: &str) {
    let started = Instant::now();
    let e = unpublish(agent, p)
        .await
        .expect_err("unpublish of a marked volume");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("needs attention"), "{}", e.message());
    assert!(e.message().contains(why), "{}", e.message());
    assert!(started.elapsed() < Duration::from_secs(8), "{e:?}");
    let e = unstage(agent, p)
        .await
        .expect_err("unstage of a marked volume");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains(why), "{}", e.message());
}

/// Retries `unpublish` as a CO would, for `within` at most.
async fn unpublish_retried(agent: &Agent, p: &Published, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        match unpublish(agent, p).await {
            Ok(()) => return,
            Err(e) if Instant::now() < deadline => {
                eprintln!("retrying unpublish: {e:?}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => panic!("unpublish still refused after the fix: {e:?}"),
        }
    }
}

#[tokio::test]
async fn a_publication_whose_parent_became_a_symlink_marks_only_its_volume() {
    let test = "a_publication_whose_parent_became_a_symlink_marks_only_its_volume";
    if !require_root(test) {
        return;
    }
    let scratch = Scratch::new("attention-symlink");
    let mut agent = Agent::start(&scratch, AgentOpts::default()).await;
    let good = publish(&agent, "good", agent.work.join("pods/good/mount")).await;
    let bad = publish(&agent, "bad", agent.work.join("pods/bad/mount")).await;
    agent.kill();
    // The bad publication's parent directory is moved (its bind goes with it) and replaced by a
    // symlink to where it went.
    let parent = agent.work.join("pods/bad");
    let moved = agent.work.join("moved-bad");
    std::fs::rename(&parent, &moved).expect("move the parent");
    std::os::unix::fs::symlink(&moved, &parent).expect("symlink in its place");

    agent.opts.wait_ready = false;
    agent.spawn().await;
    if let Err(why) = agent.try_wait_ready(Duration::from_secs(10)).await {
        panic!("one bad record must not keep the agent from being ready: {why}");
    }
    let why = "symbolic link";
    assert_status_names(&agent, &bad.vol.id, why);
    assert_refused(&agent, &bad, why).await;
    take_down_and_check(&agent, &good, "good").await;

    // The operator puts the directory back: the retried unpublish re-checks and goes through.
    std::fs::remove_file(&parent).expect("remove the symlink");
    std::fs::rename(&moved, &parent).expect("move the parent back");
    unpublish_retried(&agent, &bad, Duration::from_secs(10)).await;
    assert!(!is_mounted(&bad.target));
    assert_no_mark(&agent);
    unstage(&agent, &bad).await.expect("unstage after the fix");
    assert!(!is_mounted(&bad.staging));
    assert!(agent.child.is_some());
}

#[tokio::test]
async fn a_dead_mount_above_a_publication_marks_only_its_volume() {
    let test = "a_dead_mount_above_a_publication_marks_only_its_volume";
    if !require_root(test) {
        return;
    }
    if !Path::new("/dev/fuse").exists() {
        assert_ne!(
            std::env::var("CI").as_deref(),
            Ok("true"),
            "{test} needs /dev/fuse and CI=true: refusing to skip"
        );
        ebs_tests::skip(test, "no /dev/fuse");
        return;
    }
    let scratch = Scratch::new("attention-hung");
    // The background retry every second here (30 s by default), so the test sees it clear the
    // mark by itself. (An environment variable: an agent without the setting ignores it.)
    let mut opts = AgentOpts::default();
    opts.env
        .push(("EBS_AGENT_ATTENTION_RETRY".into(), "1s".into()));
    let mut agent = Agent::start(&scratch, opts).await;
    let good = publish(&agent, "good", agent.work.join("pods/good/mount")).await;
    let bad = publish(&agent, "bad", agent.work.join("covered/bad/mount")).await;
    agent.kill();
    // A server that never answers covers the bad volume's target (a dead NFS server). Declared
    // after the agent and the scratch directory, so dropped (aborted) before either.
    let mut covering = HungMount::new(&agent.work.join("covered")).expect("FUSE stand-in");

    agent.opts.wait_ready = false;
    agent.spawn().await;
    if let Err(why) = agent.try_wait_ready(Duration::from_secs(10)).await {
        covering.release();
        panic!("a dead mount above one record must not keep the agent from being ready: {why}");
    }
    let why = "did not finish";
    assert_status_names(&agent, &bad.vol.id, why);
    assert_refused(&agent, &bad, why).await;
    take_down_and_check(&agent, &good, "good").await;

    // The dead server goes away: the hung check ends, the background retry (or the CO's retry)
    // finds the publication as recorded, and the volume comes down with its data.
    covering.release();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let v = agent.status_json();
        let marked = v["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|e| !e["needs_attention"].is_null());
        if !marked {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the background retry did not clear the mark: {v}\n{}",
            agent.log_text()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(
        std::fs::read(bad.target.join("data.txt")).expect("read through target"),
        b"bad"
    );
    unpublish_retried(&agent, &bad, Duration::from_secs(10)).await;
    assert!(!is_mounted(&bad.target));
    unstage(&agent, &bad).await.expect("unstage after the fix");
    assert!(!is_mounted(&bad.staging));
    assert!(
        agent.log_text().lines().all(|l| !l.contains("panicked")),
        "{}",
        agent.log_text()
    );
}

/// A staged record that does not decode (written by hand into the stopped agent's state file)
/// marks its own volume; the agent gets ready, the other volume works, `status` still answers.
#[tokio::test]
async fn a_record_that_does_not_decode_marks_only_its_volume() {
    let test = "a_record_that_does_not_decode_marks_only_its_volume";
    if !require_root(test) {
        return;
    }
    let scratch = Scratch::new("attention-decode");
    let mut agent = Agent::start(&scratch, AgentOpts::default()).await;
    let good = publish(&agent, "good", agent.work.join("pods/good/mount")).await;
    let bad = publish(&agent, "bad", agent.work.join("pods/bad/mount")).await;
    agent.kill();
    {
        let store = ebs_store::Store::open(&agent.state_dir.join("state.redb")).expect("open");
        store
            .write(ebs_node_core::records::Durability::Immediate, |w| {
                w.put_staged_bytes_for_tests(&bad.vol.id, b"{\"volume_id\": 42");
                Ok(())
            })
            .expect("write a broken record");
    }
    agent.opts.wait_ready = false;
    agent.spawn().await;
    if let Err(why) = agent.try_wait_ready(Duration::from_secs(10)).await {
        panic!("one record that does not decode must not keep the agent down: {why}");
    }
    let why = "cannot be decoded";
    assert_status_names(&agent, &bad.vol.id, why);
    assert_refused(&agent, &bad, why).await;
    take_down_and_check(&agent, &good, "good").await;
    // What the operator can do about it: the bad volume's mounts are its own to take down;
    // nothing of them was touched.
    assert!(is_mounted(&bad.target) && is_mounted(&bad.staging));
}
