//! The state file as an operator meets it after damage: an emptied file is corruption like any
//! other. The agent refuses it, naming the way out, and leaves it as it was. A sound file it may
//! not write is no damage, and is never called so (a seventy-first fresh review's F2: an
//! immutable file was called "corrupt", and the message pointed to `recover --reset`).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ebs_tests::csi_req::*;
use ebs_tests::*;

use super::stage_and_publish;

/// Starts `serve` on the agent's paths and waits for it to exit by itself; an agent still
/// running after `within` is killed (by its PID) and reported as having started.
fn serve_until_exit(agent: &Agent, within: Duration) -> Result<(bool, String), String> {
    let mut child = Command::new(agent_bin())
        .args(agent.serve_args())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn agent");
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if child.try_wait().expect("agent status").is_some() {
            let out = child.wait_with_output().expect("agent output");
            let err = String::from_utf8_lossy(&out.stderr).into_owned();
            return Ok((out.status.success(), err));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    Err(format!(
        "the agent started on the emptied state file and was still running after {within:?}"
    ))
}

#[tokio::test]
async fn an_emptied_state_file_is_refused_and_recover_rebuilds_it() {
    if !require_root("an_emptied_state_file_is_refused_and_recover_rebuilds_it") {
        return;
    }
    let scratch = Scratch::new("emptied-state");
    let mut agent = Agent::start(&scratch, AgentOpts::default()).await;
    let (vol, staging, target) = stage_and_publish(&agent, "e1").await;
    agent.terminate().await.expect("the agent stops");
    let state = agent.state_dir.join("state.redb");
    std::fs::File::create(&state).expect("empty the state file");

    let (ok, err) =
        serve_until_exit(&agent, Duration::from_secs(20)).unwrap_or_else(|e| panic!("{e}"));
    assert!(!ok, "the agent exited successfully: {err}");
    assert!(
        err.contains("empty")
            && err.contains("recover --from-mounts")
            && err.contains("recover --reset"),
        "the refusal names neither the damage nor the way out: {err}"
    );
    assert_eq!(
        std::fs::metadata(&state).unwrap().len(),
        0,
        "the file was changed"
    );
    assert!(!agent.socket.exists(), "a refused start left its socket");

    let out = Command::new(agent_bin())
        .args(["recover", "--from-mounts", "--state-dir"])
        .arg(&agent.state_dir)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        said.contains("1 staged volume(s) and 1 publication(s)"),
        "{said}"
    );

    agent.spawn().await;
    let v = agent.status_json();
    assert_eq!(v["volumes"][0]["volume_id"], vol.id.as_str(), "{v}");
    unpublish_and_unstage(&agent, &vol, &staging, &target).await;
}

#[tokio::test]
async fn an_unwritable_state_file_is_never_called_corrupt() {
    if !require_root("an_unwritable_state_file_is_never_called_corrupt") {
        return;
    }
    let scratch = Scratch::new("immutable-state");
    let mut agent = Agent::start(&scratch, AgentOpts::default()).await;
    let (vol, staging, target) = stage_and_publish(&agent, "i1").await;
    agent.terminate().await.expect("the agent stops");
    let state = agent.state_dir.join("state.redb");
    struct Mutable(std::path::PathBuf);
    impl Drop for Mutable {
        fn drop(&mut self) {
            let _ = Command::new("chattr").arg("-i").arg(&self.0).status();
        }
    }
    let mutable = Mutable(state.clone());
    sh(&format!("chattr +i {}", state.display()));

    let (ok, err) =
        serve_until_exit(&agent, Duration::from_secs(20)).unwrap_or_else(|e| panic!("{e}"));
    assert!(!ok, "the agent exited successfully: {err}");
    assert!(
        err.contains("cannot be opened for writing")
            && err.contains("chattr -i")
            && !err.contains("corrupt")
            && !err.contains("recover --reset"),
        "an unwritable file called damaged: {err}"
    );
    drop(mutable);
    agent.spawn().await;
    unpublish_and_unstage(&agent, &vol, &staging, &target).await;
}

/// `recover --from-mounts` rebuilds the loop controller's attachments under the node id the agent
/// serves (`--node-id`, or `EBS_AGENT_NODE_ID` as the unit's environment gives both), so the
/// CO's idempotent ControllerPublishVolume of a rebuilt volume is OK (a sixty-ninth fresh review's
/// L1 and a seventy-first's F1: recorded under the host name, every one was refused, and its way
/// out, the unpublish, too while the volume was in use).
#[tokio::test]
async fn recover_rebuilds_attachments_under_the_agents_node_id() {
    if !require_root("recover_rebuilds_attachments_under_the_agents_node_id") {
        return;
    }
    let scratch = Scratch::new("recover-node-id");
    let mut opts = AgentOpts::default();
    opts.args.extend(["--node-id".into(), "node-n2".into()]);
    let mut agent = Agent::start(&scratch, opts).await;
    let (vol, staging, target) = stage_and_publish(&agent, "n2").await;
    agent.kill();
    let out = Command::new(agent_bin())
        .args([
            "recover",
            "--from-mounts",
            "--node-id",
            "node-n2",
            "--state-dir",
        ])
        .arg(&agent.state_dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    agent.spawn().await;
    assert_eq!(attach(&agent, &vol.id).await.device, vol.device);
    unpublish_and_unstage(&agent, &vol, &staging, &target).await;
}
