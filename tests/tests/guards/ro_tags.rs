//! A read-only raw block publication's device is found by its tag (its loop name), but a name is
//! no proof: whoever may write to a loop device may rename it, a workload its own writable raw
//! block device included. Only a read-only device over a block device is taken for one an agent
//! laid (a seventieth fresh review's F2: A's workload renamed its device to B's publication's
//! tag; B's unpublish was refused while A's bind lasted, and once it went, detached A's volume's
//! own device while A was still staged).

use std::path::Path;

use ebs_tests::csi_req::*;
use ebs_tests::*;

use csi::volume_capability::access_mode::Mode;

use super::{MIB, staged};

/// The tag (loop name) of the loop device bound at `target`.
fn tag_at(target: &Path) -> String {
    use ebs_node_host::loopdev::overlay::status_of;
    let file = std::fs::File::open(target).expect("the bound device");
    status_of(&file, target)
        .expect("its status")
        .expect("a bound loop device")
        .tag
}

#[tokio::test]
async fn a_writable_device_renamed_with_a_publications_tag_is_never_taken_for_it() {
    let _ns = crate::NAMESPACE_COPY.read().await;
    if !require_root("a_writable_device_renamed_with_a_publications_tag_is_never_taken_for_it") {
        return;
    }
    let scratch = Scratch::new("g-ro-tags");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let cap = || block_cap(Mode::SingleNodeMultiWriter);
    let (a, a_staging) = staged(&agent, "tag-a", 64 * MIB, cap()).await;
    let (b, b_staging) = staged(&agent, "tag-b", 64 * MIB, cap()).await;
    let a_target = agent.work.join("pods/a/dev");
    let b_target = agent.work.join("pods/b/dev");
    let mut node = agent.node().await;
    node.node_publish_volume(publish_req(&a, &a_staging, &a_target, cap(), false))
        .await
        .expect("A's writable publish");
    node.node_publish_volume(publish_req(&b, &b_staging, &b_target, cap(), true))
        .await
        .expect("B's read-only publish");
    let tag = tag_at(&b_target);
    assert!(tag.starts_with("ebsna-ro:"), "{tag}");
    // A's workload renames its own device (it may: it holds it open for writing).
    ebs_node_host::loopdev::rename(Path::new(&a.device), &tag).expect("rename");

    node.node_unpublish_volume(unpublish_req(&b, &b_target))
        .await
        .unwrap_or_else(|e| panic!("B's unpublish: {e:?}\n{}", agent.log_text()));
    node.node_unpublish_volume(unpublish_req(&a, &a_target))
        .await
        .expect("A's unpublish");
    assert!(
        Path::new(&format!(
            "/sys/block/{}/loop",
            a.device.trim_start_matches("/dev/")
        ))
        .exists(),
        "A's own device was detached"
    );
    node.node_publish_volume(publish_req(&a, &a_staging, &a_target, cap(), true))
        .await
        .unwrap_or_else(|e| panic!("A's read-only publish: {e:?}\n{}", agent.log_text()));
    node.node_unpublish_volume(unpublish_req(&a, &a_target))
        .await
        .expect("A's read-only unpublish");
    for (v, staging) in [(&a, &a_staging), (&b, &b_staging)] {
        node.node_unstage_volume(unstage_req(v, staging))
            .await
            .expect("unstage");
    }
}
