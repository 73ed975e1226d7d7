//! A devicePath that names nothing (a reboot renumbered the loop devices) is looked up by the
//! volume's backing file, like a devicePath that names another device.

use ebs_tests::csi_req::*;
use ebs_tests::*;

use super::{MIB, fs_cap, write_and_unstage};

#[tokio::test]
async fn a_missing_device_path_finds_the_volume_by_its_file() {
    if !require_root("a_missing_device_path_finds_the_volume_by_its_file") {
        return;
    }
    let scratch = Scratch::new("stale-device-path");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let a = create_attached(&agent, "stale-a", 64 * MIB).await;
    let b = create_attached(&agent, "stale-b", 64 * MIB).await;
    let staging = agent.work.join("stage");
    write_and_unstage(&agent, &a, &staging, "volume a").await;
    write_and_unstage(&agent, &b, &staging, "volume b").await;

    // A loop device number nothing has, as after a reboot that attached fewer files.
    let gone = (900..100_000)
        .map(|n| format!("/dev/loop{n}"))
        .find(|p| !std::path::Path::new(p).exists())
        .expect("a free loop number");
    for (vol, text) in [(&a, "volume a"), (&b, "volume b")] {
        let stale = Vol {
            id: vol.id.clone(),
            device: gone.clone(),
        };
        agent
            .node()
            .await
            .node_stage_volume(stage_req(&stale, &staging, fs_cap()))
            .await
            .unwrap_or_else(|e| panic!("stage with devicePath {gone}: {e:?}"));
        // The bytes and the filesystem are the volume's own.
        assert_eq!(
            std::fs::read_to_string(staging.join("whose")).expect("read"),
            text
        );
        let source = std::process::Command::new("findmnt")
            .args(["-n", "-o", "SOURCE", "--mountpoint"])
            .arg(&staging)
            .output()
            .expect("findmnt");
        let source = String::from_utf8_lossy(&source.stdout).trim().to_string();
        assert_eq!(source, vol.device, "mounted from the volume's device");
        assert_eq!(fs_uuid(&source), fs_uuid(&vol.device));
        agent
            .node()
            .await
            .node_unstage_volume(unstage_req(vol, &staging))
            .await
            .expect("unstage");
    }
    // A devicePath that exists but is no block device is still refused.
    let not_a_device = Vol {
        id: a.id.clone(),
        device: "/etc/hostname".into(),
    };
    let e = agent
        .node()
        .await
        .node_stage_volume(stage_req(&not_a_device, &staging, fs_cap()))
        .await
        .expect_err("a regular file as devicePath");
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
}
