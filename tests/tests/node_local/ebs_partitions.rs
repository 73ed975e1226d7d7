//! Issue 49 (a tenth fresh review's F3): on EBS with `--allow-unverified-devices`, a disk with no
//! serial is known by its numbers only, and a partition has numbers of its own. Two volumes
//! never share one disk: a claim on such a device is keyed by its whole disk, so a partition of
//! a disk another volume holds (or the disk of a partition another volume holds) is refused.

use std::collections::HashMap;

use ebs_node_fixture::Fixture;
use ebs_tests::csi_req::*;
use ebs_tests::*;

use csi::volume_capability::access_mode::Mode;
use tonic::Code;

/// A partitioned loop device (two partitions), detached on drop.
struct Partitioned(String);

impl Drop for Partitioned {
    fn drop(&mut self) {
        let _ = std::process::Command::new("partx")
            .args(["-d", &self.0])
            .status();
        detach_loop(std::path::Path::new(&self.0));
    }
}

fn numbers(path: &str) -> (u32, u32) {
    let n = ebs_node_host::device::block_devnum(std::path::Path::new(path)).expect("numbers");
    (n.major, n.minor)
}

#[tokio::test]
async fn a_partition_of_a_disk_another_volume_holds_is_never_a_second_volume() {
    let _shared = crate::NAMESPACE_COPY.read().await;
    if !require_root("a_partition_of_a_disk_another_volume_holds_is_never_a_second_volume") {
        return;
    }
    let scratch = Scratch::new("node-local-parts");
    let img = scratch.join("parts.img");
    sh(&format!(
        "truncate -s 128M {i} && printf 'label: gpt\\nstart=2048, size=100000\\nstart=104448, size=100000\\n' | sfdisk -q {i}",
        i = img.display()
    ));
    let out = sh(&format!("losetup --find --show -P {}", img.display()));
    let disk = Partitioned(String::from_utf8_lossy(&out.stdout).trim().to_string());
    let part = format!("{}p1", disk.0);
    // Where the kernel did not scan the table at attach (no partscan), partx adds them.
    let _ = std::process::Command::new("partx")
        .args(["-a", &disk.0])
        .status();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !std::path::Path::new(&part).exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "{part} never appeared"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let f = Fixture::at(&scratch.join("fixture")).expect("fixture");
    f.xen("xvdf", 80).expect("xen disk");
    let (major, minor) = numbers(&disk.0);
    f.set_dev("xvdf", major, minor).expect("dev");
    let p1 = f.partition("xvdf", 1).expect("partition");
    let (pmajor, pminor) = numbers(&part);
    std::fs::write(
        f.sys_root().join("block/xvdf").join(&p1).join("dev"),
        format!("{pmajor}:{pminor}\n"),
    )
    .expect("partition numbers");
    for (name, real) in [("xvdf", &disk.0), (p1.as_str(), &part)] {
        std::fs::remove_file(f.dev_root().join(name)).expect("the fixture's node");
        f.link(name, real).expect("link");
    }
    let dev = f.dev_root();
    let agent = super::ebs::agent(&scratch, &f, &["--allow-unverified-devices"]).await;
    let device = dev.join("xvdf").display().to_string();
    let vol = |id: &str| Vol {
        id: id.into(),
        device: device.clone(),
    };
    let mut node = agent.node().await;
    let a = vol("vol-0aaaaaaaaaaaaaaaa");
    node.node_stage_volume(stage_req(
        &a,
        &agent.work.join("staging/a"),
        block_cap(Mode::SingleNodeWriter),
    ))
    .await
    .expect("a stages the whole disk raw");
    let before = checksum(std::path::Path::new(&disk.0));
    let mut b = stage_req(
        &vol("vol-0bbbbbbbbbbbbbbbb"),
        &agent.work.join("staging/b"),
        mount_cap("ext4", Mode::SingleNodeWriter),
    );
    b.volume_context = HashMap::from([("partition".to_string(), "1".to_string())]);
    let e = node
        .node_stage_volume(b)
        .await
        .expect_err("a partition of a's disk was staged as a second volume");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert_eq!(
        before,
        checksum(std::path::Path::new(&disk.0)),
        "a's disk changed"
    );
    node.node_unstage_volume(unstage_req(&a, &agent.work.join("staging/a")))
        .await
        .expect("unstage a");
}
