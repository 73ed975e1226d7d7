//! Item 9: `ro` among the mount flags is a read-only mount wherever mount flags are accepted:
//! at publish (the bind), and at stage (the staging mount, and so every publication of it).

use ebs_tests::csi_req::*;
use ebs_tests::*;

use csi::volume_capability::access_mode::Mode;

use super::{MIB, write_fails};

#[tokio::test]
async fn ro_in_mount_flags_makes_a_read_only_mount() {
    let _ns = crate::NAMESPACE_COPY.read().await;
    if !require_root("ro_in_mount_flags_makes_a_read_only_mount") {
        return;
    }
    let scratch = Scratch::new("g-roflags");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let vol = create_attached(&agent, "ro", 64 * MIB).await;
    let staging = agent.work.join("staging/ro");
    let mut node = agent.node().await;
    let rw = mount_cap("ext4", Mode::SingleNodeWriter);
    let ro = mount_cap_flags("ext4", Mode::SingleNodeWriter, &["ro"]);

    // Publish: `ro` in the flags, the readonly field false.
    node.node_stage_volume(stage_req(&vol, &staging, rw.clone()))
        .await
        .expect("stage");
    let target = agent.work.join("pods/a/mount");
    node.node_publish_volume(publish_req(&vol, &staging, &target, ro.clone(), false))
        .await
        .expect("publish with ro");
    write_fails(&target.join("file")).expect("publish with mount_flags [ro]");
    std::fs::write(staging.join("staged-rw"), b"x").expect("the staging mount stays writable");
    node.node_unpublish_volume(unpublish_req(&vol, &target))
        .await
        .expect("unpublish");
    node.node_unstage_volume(unstage_req(&vol, &staging))
        .await
        .expect("unstage");

    // Stage: `ro` in the flags makes the staging mount read-only, and a publication without
    // any read-only request is read-only too.
    node.node_stage_volume(stage_req(&vol, &staging, ro.clone()))
        .await
        .expect("stage with ro");
    write_fails(&staging.join("file")).expect("stage with mount_flags [ro]");
    let target = agent.work.join("pods/b/mount");
    node.node_publish_volume(publish_req(&vol, &staging, &target, rw, false))
        .await
        .expect("publish");
    write_fails(&target.join("file")).expect("publish of a stage with mount_flags [ro]");
    assert!(target.join("staged-rw").exists());
    node.node_unpublish_volume(unpublish_req(&vol, &target))
        .await
        .expect("unpublish");
    node.node_unstage_volume(unstage_req(&vol, &staging))
        .await
        .expect("unstage");
}
