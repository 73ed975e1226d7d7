//! The private place where read-only binds are made without the new mount API (the state
//! directory's `binds`, a tmpfs of the agent's own): a bind a crash left there is detached at
//! the next start, whether that start will need the place or not (a seventy-third fresh review's
//! F2: left by a run under a filter denying the mount API, a run without the filter never
//! looked; the leftover kept the volume's filesystem mounted and its unstage was refused for
//! good), and `recover --from-mounts` never records it as a publication (its F1, variant B).

use ebs_tests::csi_req::*;
use ebs_tests::*;

use super::stage_and_publish;

/// What a crash between a private bind and its detach leaves: the agent's tmpfs at `binds`, and
/// a read-only bind of the staging in it.
fn leave_a_private_bind(agent: &Agent, staging: &std::path::Path) -> std::path::PathBuf {
    let binds = agent.state_dir.join("binds");
    let left = binds.join("9999-0");
    sh(&format!(
        "mkdir -p {b} && (grep -q ' {b} ' /proc/self/mountinfo || \
         mount -t tmpfs -o mode=0700,size=64k ebs-node-agent-binds {b}) && \
         mount --make-private {b} && mkdir {l} && mount --bind {s} {l} && \
         mount -o remount,bind,ro,nodev {l}",
        b = binds.display(),
        l = left.display(),
        s = staging.display()
    ));
    left
}

#[tokio::test]
async fn a_private_bind_a_crash_left_is_detached_at_the_next_start() {
    if !require_root("a_private_bind_a_crash_left_is_detached_at_the_next_start") {
        return;
    }
    for from_mounts in [false, true] {
        let scratch = Scratch::new("private-binds");
        let mut agent = Agent::start(&scratch, AgentOpts::default()).await;
        let (vol, staging, target) = stage_and_publish(&agent, "pb").await;
        agent.kill();
        let left = leave_a_private_bind(&agent, &staging);
        let _left = Unmount(left.clone());
        if from_mounts {
            let said = agent.recover("--from-mounts");
            let recorded = format!("published at {}", left.display());
            assert!(!said.contains(&recorded), "{said}");
        }
        agent.spawn().await;
        assert!(
            !mounts_below(&agent.state_dir).contains(&left),
            "from_mounts={from_mounts}: the leftover stayed\n{}",
            agent.log_text()
        );
        unpublish_and_unstage(&agent, &vol, &staging, &target).await;
    }
}
