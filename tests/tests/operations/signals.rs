//! Signals a daemon meets besides SIGTERM: SIGHUP (a closed terminal, a shell exiting without
//! nohup, a supervisor's "reload", Nomad's `change_signal`) never kills the agent mid-call.

use std::time::Duration;

use csi::volume_capability::access_mode::Mode;
use ebs_tests::addons::Thaw;
use ebs_tests::csi_req::*;
use ebs_tests::*;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

#[tokio::test]
async fn sighup_during_a_stage_kills_nothing_and_sigterm_still_drains() {
    if !require_root("sighup_during_a_stage_kills_nothing_and_sigterm_still_drains") {
        return;
    }
    // A stage held in flight without slowing the agent down: the volume files live on a
    // filesystem of their own, frozen while the stage formats (mkfs's writes reach the file).
    let scratch = Scratch::new("sighup");
    let volumes = scratch.join("state/volumes");
    std::fs::create_dir_all(&volumes).unwrap();
    let outer = scratch.join("outer.img");
    sh(&format!(
        "truncate -s 512M {0} && mkfs.ext4 -q {0} && mount -o loop {0} {1}",
        outer.display(),
        volumes.display()
    ));
    let mut agent = Agent::start(&scratch, AgentOpts::default()).await;
    let pid = Pid::from_raw(agent.pid() as i32);
    let vol = create_attached(&agent, "hup", 64 << 20).await;
    let staging = agent.work.join("stage-hup");
    let cap = mount_cap("ext4", Mode::SingleNodeWriter);

    let thaw = Thaw::freeze(&volumes);
    let mut node = agent.node().await;
    let req = stage_req(&vol, &staging, cap);
    let stage = tokio::spawn(async move { node.node_stage_volume(req).await });
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!stage.is_finished(), "the stage was not held in flight");

    kill(pid, Signal::SIGHUP).unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let died = agent
        .child
        .as_mut()
        .and_then(|c| c.try_wait().ok().flatten());
    assert!(
        died.is_none(),
        "SIGHUP killed the agent mid-stage ({died:?}); socket left: {}",
        agent.socket.exists()
    );
    drop(thaw);
    let staged = tokio::time::timeout(Duration::from_secs(60), stage)
        .await
        .expect("the stage ends")
        .expect("stage task");
    assert!(staged.is_ok(), "stage after SIGHUP: {staged:?}");
    assert!(agent.log_text().contains("SIGHUP"), "SIGHUP is not logged");

    // Still serving: the volume unstages, then SIGTERM drains and removes the socket.
    agent
        .node()
        .await
        .node_unstage_volume(unstage_req(&vol, &staging))
        .await
        .expect("unstage after SIGHUP");
    assert!(mounts_below(&agent.work).is_empty(), "a mount was left");
    let status = agent.terminate().await.expect("SIGTERM stops the agent");
    assert!(status.success(), "{status}");
    assert!(!agent.socket.exists(), "the socket file was left");
}
