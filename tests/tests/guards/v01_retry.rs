//! Item 8: a v0.1 NodePublishVolume retried while the first call still stages never removes the
//! staging directory the first call is using.

use std::time::Duration;

use ebs_tests::csi_req::*;
use ebs_tests::legacy::*;
use ebs_tests::*;

use tonic::Code;

use super::{MIB, is_mounted};

#[tokio::test]
async fn a_v01_retry_never_removes_the_first_calls_staging_directory() {
    let _ns = crate::NAMESPACE_COPY.read().await;
    if !require_root("a_v01_retry_never_removes_the_first_calls_staging_directory") {
        return;
    }
    let scratch = Scratch::new("g-v01");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    for round in 0..3u64 {
        // xfs on 512 MiB: the first call is still formatting when the retry comes.
        let vol = create_attached(&agent, &format!("v01-{round}"), 512 * MIB).await;
        let target = agent.work.join(format!("pods/{round}/mount"));
        let staging = agent.state_dir.join("v01-staging").join(&vol.id);
        let info = vol.publish_context();
        let node = v01_node(&agent).await;
        let first = {
            let (mut node, req) = (node.clone(), v01_publish(&vol.id, &info, &target, "xfs"));
            tokio::spawn(async move { node.node_publish_volume(req).await })
        };
        tokio::time::sleep(Duration::from_millis(20 + round * 20)).await;
        let retry = node
            .clone()
            .node_publish_volume(v01_publish(&vol.id, &info, &target, "xfs"))
            .await;
        let first = first.await.expect("first call");
        // Whichever call the agent took first publishes; the other, while it runs, is
        // ABORTED (operation pending) and undoes nothing of it.
        for r in [&first, &retry] {
            if let Err(e) = r {
                assert_eq!(
                    e.code(),
                    Code::Aborted,
                    "round {round}: {first:?} / {retry:?}"
                );
            }
        }
        assert!(
            first.is_ok() || retry.is_ok(),
            "round {round}: both calls failed: {first:?} / {retry:?}"
        );
        assert!(is_mounted(&target) && is_mounted(&staging), "round {round}");
        node.clone()
            .node_unpublish_volume(v01_unpublish(&vol.id, &target))
            .await
            .expect("unpublish");
        assert!(
            !is_mounted(&target) && !is_mounted(&staging),
            "round {round}"
        );
        assert!(
            !staging.exists(),
            "round {round}: the staging directory stays"
        );
    }
}
