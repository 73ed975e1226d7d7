//! Item 10: a CreateVolume whose sizing failed leaves no volume behind, so a retry never returns
//! a 0-byte volume, and a corrected retry (a size that fits) succeeds.

use ebs_tests::csi_req::*;
use ebs_tests::*;

use csi::volume_capability::access_mode::Mode;
use tonic::Code;

async fn create(agent: &Agent, name: &str, bytes: i64) -> Result<csi::Volume, tonic::Status> {
    agent
        .controller()
        .await
        .create_volume(csi::CreateVolumeRequest {
            name: name.into(),
            capacity_range: at_least(bytes),
            // Block: no filesystem limit is checked up front, the file's sizing is what fails.
            volume_capabilities: vec![block_cap(Mode::SingleNodeWriter)],
            ..Default::default()
        })
        .await
        .map(|r| r.into_inner().volume.expect("volume"))
}

/// The files in the volume directory with their sizes.
fn files(agent: &Agent) -> Vec<(String, u64)> {
    let dir = agent.state_dir.join("volumes");
    let mut out: Vec<(String, u64)> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| {
                    let len = e.metadata().map(|m| m.len()).unwrap_or(0);
                    (e.file_name().to_string_lossy().into_owned(), len)
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

#[tokio::test]
async fn a_create_retry_after_a_failed_sizing_never_returns_an_empty_volume() {
    let _ns = crate::NAMESPACE_COPY.read().await;
    if !require_root("a_create_retry_after_a_failed_sizing_never_returns_an_empty_volume") {
        return;
    }
    let scratch = Scratch::new("g-create");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    // 17 TiB is beyond ext4's largest file (EFBIG); i64::MAX rounds up to whole MiB beyond any
    // file size. Whichever the state directory's filesystem refuses is the case tested.
    let mut refused = 0;
    for (name, bytes) in [("huge", 17i64 << 40), ("max", i64::MAX)] {
        let Err(first) = create(&agent, name, bytes).await else {
            eprintln!("{name}: the volume directory's filesystem holds {bytes} bytes; skipped");
            continue;
        };
        refused += 1;
        let retry = create(&agent, name, bytes).await;
        let e = retry.expect_err("the retry must not return a volume whose file was never sized");
        assert_eq!(first.code(), Code::OutOfRange, "{name}: {first:?}");
        assert_eq!(e.code(), Code::OutOfRange, "{name}: {e:?}");
        assert!(
            files(&agent).is_empty(),
            "{name}: files left: {:?}",
            files(&agent)
        );
        // A corrected retry is not held to the failed one.
        let v = create(&agent, name, 8 << 20)
            .await
            .expect("a size that fits");
        assert_eq!(v.capacity_bytes, 8 << 20);
        let file = format!("{}.img", v.volume_id);
        assert_eq!(files(&agent), vec![(file, 8 << 20)], "{name}");
        agent
            .controller()
            .await
            .delete_volume(csi::DeleteVolumeRequest {
                volume_id: v.volume_id,
                ..Default::default()
            })
            .await
            .expect("delete");
    }
    assert!(refused > 0, "no size was refused");
}
