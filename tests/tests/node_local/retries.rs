//! A retried or restarted attachment keeps its own device (a sixteenth fresh review's F1): a
//! device someone lays over the volume's file at a lower number, writable where the attachment
//! is read-only, is never handed out, never recorded as the agent's, never detached by it.

use ebs_tests::csi_req::*;
use ebs_tests::*;

use super::controller::{attach_req, detach};
use super::owners::{DetachOnDrop, SIZE};

#[tokio::test]
async fn a_read_only_attachment_keeps_its_device_through_retries_and_restarts() {
    // Alone: the device numbers are the point (a number freed here must not go to another
    // test's `losetup -f` before it is bound again).
    let _alone = crate::NAMESPACE_COPY.write().await;
    if !require_root("a_read_only_attachment_keeps_its_device_through_retries_and_restarts") {
        return;
    }
    let scratch = Scratch::new("node-local-ro-retry");
    let mut agent = Agent::start(&scratch, AgentOpts::default()).await;
    let node_name = node_id(&agent).await;
    let id = create_volume(&agent, "w", SIZE, &[]).await;
    let file = agent.state_dir.join(format!("volumes/{id}.img"));
    // Hold the lowest free number while the controller attaches, then give it to a writable
    // device over the same file.
    let dummy_file = scratch.join("dummy.img");
    sh(&format!("truncate -s 1M {}", dummy_file.display()));
    let dummy = super::losetup("", dummy_file.display());
    let own = attach(&agent, &id, &node_name).await;
    let _own = DetachOnDrop(own.clone());
    detach_loop(std::path::Path::new(&dummy));
    rebind_loop(&dummy, &file);
    let _writable = DetachOnDrop(dummy.clone());
    assert_eq!(
        attach(&agent, &id, &node_name).await,
        own,
        "a retry handed out another device"
    );
    agent.terminate().await;
    agent.spawn().await;
    assert_eq!(
        attach(&agent, &id, &node_name).await,
        own,
        "a restart switched the device"
    );
    agent
        .controller()
        .await
        .controller_unpublish_volume(detach(&id, &node_name))
        .await
        .expect("detach");
    let bound = |dev: &str| {
        std::path::Path::new(&format!(
            "/sys/block/{}/loop",
            dev.trim_start_matches("/dev/")
        ))
        .exists()
    };
    assert!(
        bound(&dummy),
        "the controller detached a device it did not make"
    );
    assert!(
        !bound(&own)
            || std::fs::read_to_string(format!(
                "/sys/block/{}/loop/autoclear",
                own.trim_start_matches("/dev/")
            ))
            .is_ok_and(|a| a.trim() == "1"),
        "the controller left its own device"
    );
}

/// A read-only ControllerPublish of `id`: the device it hands out.
async fn attach(agent: &Agent, id: &str, node: &str) -> String {
    agent
        .controller()
        .await
        .controller_publish_volume(attach_req(id, node, true))
        .await
        .expect("read-only attach")
        .into_inner()
        .publish_context["devicePath"]
        .clone()
}
