//! A format intent (the UUID chosen before mkfs ran) proves that our mkfs wrote that UUID only
//! while nobody else can have written the device since. Once the volume was handed out as a raw
//! block device, or detached and attached again (used elsewhere, another node), a filesystem
//! carrying that UUID may be the user's: it is used as found, never formatted over.

use std::path::Path;

use ebs_tests::csi_req::*;
use ebs_tests::*;

use csi::volume_capability::access_mode::Mode;

use super::{MIB, fs_cap};

/// A stage whose mkfs fails (mke2fs refuses an inode larger than the block) after the format
/// intent was journaled; returns the UUID the intent chose.
async fn failed_mkfs(agent: &Agent, vol: &Vol, staging: &Path) -> String {
    let mut req = stage_req(vol, staging, fs_cap());
    req.volume_context = [("blockSize", "1024"), ("inodeSize", "4096")]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let mut node = agent.node().await;
    node.node_stage_volume(req)
        .await
        .expect_err("mkfs must fail");
    let v = agent.status_json();
    let fs = &v["volumes"][0]["filesystem"];
    assert_eq!(fs["state"], "intent", "{v}");
    fs["uuid"].as_str().expect("the intent's UUID").to_string()
}

/// What a workload leaves: an ext4 carrying `uuid` with a file in it, made on `device` (a block
/// device or an image file).
fn users_filesystem(scratch: &Scratch, device: &Path, uuid: &str) {
    let dir = scratch.join("users-files");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("user.txt"), b"the user's data").unwrap();
    let out = sh(&format!(
        "mkfs.ext4 -q -F -U {uuid} -d '{}' '{}' && sync",
        dir.display(),
        device.display()
    ));
    assert!(out.status.success(), "{out:?}");
}

/// The stage after: formatting is the one wrong answer. Using the filesystem as found (the
/// user's file is there) or refusing (the bytes unchanged) both keep the promise.
async fn stage_keeps_the_users_file(agent: &Agent, vol: &Vol, staging: &Path) {
    let before = checksum(Path::new(&vol.device));
    let mut node = agent.node().await;
    match node
        .node_stage_volume(stage_req(vol, staging, fs_cap()))
        .await
    {
        Ok(_) => {
            let found = std::fs::read(staging.join("user.txt"));
            assert!(
                matches!(&found, Ok(b) if b == b"the user's data"),
                "the stage formatted over the user's filesystem: user.txt {found:?}\n{}",
                agent.log_text()
            );
            // What this test proves is the stage's; the unstage only cleans up, retried as
            // kubelet retries it (one failed once under heavy I/O; its error is kept).
            let mut last = None;
            for _ in 0..5 {
                match node.node_unstage_volume(unstage_req(vol, staging)).await {
                    Ok(_) => {
                        last = None;
                        break;
                    }
                    Err(e) => {
                        eprintln!("unstage failed, retrying: {e:?}");
                        last = Some(e);
                        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                    }
                }
            }
            assert!(last.is_none(), "unstage: {last:?}\n{}", agent.log_text());
        }
        Err(e) => {
            assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
            assert_eq!(checksum(Path::new(&vol.device)), before, "bytes changed");
        }
    }
    assert_eq!(
        agent.log_text().matches(" formatted").count(),
        0,
        "nothing may be formatted"
    );
}

#[tokio::test]
async fn a_format_intent_licenses_nothing_after_raw_block_use() {
    if !require_root("a_format_intent_licenses_nothing_after_raw_block_use") {
        return;
    }
    let scratch = Scratch::new("own-intent-raw");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let vol = create_attached(&agent, "v", 64 * MIB).await;
    let staging = agent.work.join("staging/v");
    let uuid = failed_mkfs(&agent, &vol, &staging).await;

    // The CO stages and publishes it as a raw block device; the workload writes a filesystem
    // that happens to carry the intent's UUID (a restored image, a copy of an old disk).
    let cap = block_cap(Mode::SingleNodeWriter);
    let raw_staging = agent.work.join("staging/v-raw");
    let target = agent.work.join("pods/v/dev");
    let mut node = agent.node().await;
    node.node_stage_volume(stage_req(&vol, &raw_staging, cap.clone()))
        .await
        .expect("block stage");
    node.node_publish_volume(publish_req(&vol, &raw_staging, &target, cap, false))
        .await
        .expect("block publish");
    users_filesystem(&scratch, &target, &uuid);
    node.node_unpublish_volume(unpublish_req(&vol, &target))
        .await
        .expect("unpublish");
    node.node_unstage_volume(unstage_req(&vol, &raw_staging))
        .await
        .expect("unstage");

    stage_keeps_the_users_file(&agent, &vol, &staging).await;
}

#[tokio::test]
async fn a_format_intent_licenses_nothing_on_another_attachment() {
    if !require_root("a_format_intent_licenses_nothing_on_another_attachment") {
        return;
    }
    let scratch = Scratch::new("own-intent-moved");
    let mut agent = Agent::start(&scratch, AgentOpts::default()).await;
    let vol = create_attached(&agent, "v", 64 * MIB).await;
    let staging = agent.work.join("staging/v");
    let uuid = failed_mkfs(&agent, &vol, &staging).await;
    let out = sh(&format!("losetup -nO BACK-FILE {}", vol.device));
    let image = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(!image.is_empty(), "{out:?}");

    // Detached (the pod moved to another node, which used it), then attached here again, and
    // the agent restarted in between for good measure.
    let node_id = node_id(&agent).await;
    agent
        .controller()
        .await
        .controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
            volume_id: vol.id.clone(),
            node_id,
            ..Default::default()
        })
        .await
        .expect("detach");
    users_filesystem(&scratch, Path::new(&image), &uuid);
    agent.restart(None).await;
    let vol = attach(&agent, &vol.id).await;

    stage_keeps_the_users_file(&agent, &vol, &staging).await;
}
