//! The store's boot log (issue 52): a filesystem publish's bind intent is `Durability::Boot`,
//! written to this boot's log without an fsync. What a kill -9 right after it leaves must be
//! what the restarted agent knows, before any retry: the intent (so the retry resumes, and a
//! second publish of a single-writer volume is still refused). The unstage's release, fsync'd,
//! is checked the same way.

use ebs_tests::crash_points::{self as cp, Op as J, Step as S};

use super::*;

/// The publications the running agent's status lists for its one volume.
fn publications(agent: &Agent) -> usize {
    let v = agent.status_json();
    v["volumes"][0]["published"]
        .as_array()
        .map_or(0, |p| p.len())
}

#[tokio::test]
async fn a_publish_intent_outlives_a_kill_without_an_fsync() {
    if !require_root("a_publish_intent_outlives_a_kill_without_an_fsync") {
        return;
    }
    let (_scratch, mut agent, c) =
        agent_with_volume("bootlog", crash_opts(None), "b", 64 << 20, "ext4").await;
    call(&agent, &c, Op::Stage).await.unwrap();

    // Killed right after the bind intent: nothing durable came after it. Start-up drops an
    // intent with nothing bound at its target, but the journal shows it came back.
    let point = cp::intent(J::Publish, S::Bind);
    agent.restart(Some(crash_opts(Some(&point)))).await;
    assert!(call(&agent, &c, Op::Publish).await.is_err());
    agent
        .wait_exit(Duration::from_secs(20))
        .await
        .expect("crashed at the bind intent");
    agent.restart(Some(crash_opts(None))).await;
    let v = agent.status_json();
    assert_eq!(
        (
            &v["volumes"][0]["last_step"]["op"],
            &v["volumes"][0]["last_step"]["step"]
        ),
        (&"publish".into(), &"bind".into()),
        "the bind intent is lost: {v}"
    );

    // Killed right after the bind, its done line never committed: the intent alone vouches
    // for the bind, and start-up completes the publication from it.
    let point = cp::done(J::Publish, S::Bind);
    agent.restart(Some(crash_opts(Some(&point)))).await;
    assert!(call(&agent, &c, Op::Publish).await.is_err());
    agent
        .wait_exit(Duration::from_secs(20))
        .await
        .expect("crashed after the bind");
    agent.restart(Some(crash_opts(None))).await;
    assert_eq!(
        publications(&agent),
        1,
        "the bind intent is lost: {}",
        agent.status_json()
    );
    call(&agent, &c, Op::Publish).await.expect("the retry");
    assert_eq!(mount_count(&c.target), 1);
    call(&agent, &c, Op::Unpublish).await.unwrap();

    // Killed right after the unstage's release was committed (and before its answer).
    let point = cp::done(J::Unstage, S::Unstaged);
    agent.restart(Some(crash_opts(Some(&point)))).await;
    assert!(call(&agent, &c, Op::Unstage).await.is_err());
    agent
        .wait_exit(Duration::from_secs(20))
        .await
        .expect("crashed after the release");
    agent.restart(Some(crash_opts(None))).await;
    let v = agent.status_json();
    assert!(
        v["volumes"][0]["staged"].is_null(),
        "the release came back undone: {v}"
    );
    assert_eq!(mount_count(&c.staging), 0);
    call(&agent, &c, Op::Unstage).await.expect("the retry");
}
