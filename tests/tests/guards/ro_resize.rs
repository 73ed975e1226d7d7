//! Issue 49: a read-only raw block publication follows a resize. NodeExpandVolume answers the
//! new size only when the workload's device (the read-only device laid over the volume's) shows
//! it too, whether the CO names the staging path or the publication.

use std::path::Path;
use std::process::Command;

use ebs_tests::csi_req::*;
use ebs_tests::*;

use csi::volume_capability::access_mode::Mode;

use super::MIB;
use super::ro_block::{Overlays, check_read_only, loops_over, staged_block, target};

/// The size of the block device at `path` (BLKGETSIZE64, through blockdev).
fn device_size(path: &Path) -> i64 {
    let out = Command::new("blockdev")
        .arg("--getsize64")
        .arg(path)
        .output()
        .expect("blockdev");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("blockdev {}: {out:?}", path.display()))
}

#[tokio::test]
async fn a_read_only_block_publication_follows_a_resize() {
    let _ns = crate::NAMESPACE_COPY.read().await;
    if !require_root("a_read_only_block_publication_follows_a_resize") {
        return;
    }
    let scratch = Scratch::new("g-roresize");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let (vol, staging) = staged_block(&agent, "grow", Mode::MultiNodeMultiWriter).await;
    let _overlays = Overlays(vol.device.clone());
    let cap = block_cap(Mode::MultiNodeMultiWriter);
    let mut node = agent.node().await;
    let (t1, t2) = (target(&agent, "a"), target(&agent, "b"));
    for t in [&t1, &t2] {
        node.node_publish_volume(publish_req(&vol, &staging, t, cap.clone(), true))
            .await
            .expect("publish readonly");
    }
    assert_eq!(device_size(&t1), 16 * MIB);
    // The CO names the staging path, then a publication.
    for (size, path) in [(32 * MIB, &staging), (48 * MIB, &t2)] {
        agent
            .expand_on_controller(&vol.id, size, Some(cap.clone()))
            .await
            .expect("controller expand");
        let answer = node
            .node_expand_volume(csi::NodeExpandVolumeRequest {
                volume_id: vol.id.clone(),
                volume_path: path.display().to_string(),
                staging_target_path: staging.display().to_string(),
                capacity_range: at_least(size),
                volume_capability: Some(cap.clone()),
                ..Default::default()
            })
            .await
            .unwrap_or_else(|e| panic!("node expand to {size}: {e:?}\n{}", agent.log_text()))
            .into_inner();
        assert_eq!(answer.capacity_bytes, size);
        for t in [&t1, &t2] {
            assert_eq!(
                device_size(t),
                size,
                "NodeExpandVolume said {size} bytes; the workload's device at {} did not follow",
                t.display()
            );
            check_read_only(&vol, t);
        }
    }
    for t in [&t1, &t2] {
        node.node_unpublish_volume(unpublish_req(&vol, t))
            .await
            .expect("unpublish");
    }
    assert_eq!(loops_over(&vol.device), Vec::<String>::new());
    node.node_unstage_volume(unstage_req(&vol, &staging))
        .await
        .expect("unstage");
}
