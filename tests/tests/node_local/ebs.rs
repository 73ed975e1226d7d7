//! The ebs backend: a node-local handle's device is the disk the kernel shows at that path, and
//! upstream's `publish_context["volumeID"]` is the EBS volume it must be (its NVMe serial). The
//! disk is a real loop device that a sysfs fixture describes as an EBS namespace.

use std::collections::HashMap;

use ebs_node_core::ec2::ebs::EBS_MODEL;
use ebs_node_fixture::Fixture;
use ebs_tests::csi_req::*;
use ebs_tests::*;

use csi::volume_capability::access_mode::Mode;
use tonic::Code;

use super::Disk;

const SERIAL: &str = "vol0123456789abcdef0";

#[tokio::test]
async fn on_ebs_the_volume_id_is_the_disks_serial() {
    // Alone: its disks' checksums and sizes are read across calls, and another test's loop
    // churn (a number freed by one test's clean-up and taken by another's) was seen to change
    // them under it (one run in four, with the namespace tests beside it).
    let _alone = crate::NAMESPACE_COPY.write().await;
    if !require_root("on_ebs_the_volume_id_is_the_disks_serial") {
        return;
    }
    let scratch = Scratch::new("node-local-ebs");
    let disk = Disk::new(&scratch, "pre-attached", 64 << 20);
    let f = Fixture::at(&scratch.join("fixture")).expect("fixture");
    let names = f.nvme(1, Some(SERIAL), EBS_MODEL, &[1]).expect("nvme");
    let numbers = ebs_node_host::device::block_devnum(&disk.dev).expect("numbers");
    let (major, minor) = (numbers.major, numbers.minor);
    f.set_dev(&names[0], major, minor).expect("dev");
    f.link(&names[0], &disk.dev).expect("link");
    // A second disk without a serial, as on Xen instances.
    let xen = Disk::new(&scratch, "serial-less", 64 << 20);
    let names2 = f.nvme(2, None, EBS_MODEL, &[1]).expect("nvme");
    let numbers = ebs_node_host::device::block_devnum(&xen.dev).expect("numbers");
    let (major, minor) = (numbers.major, numbers.minor);
    f.set_dev(&names2[0], major, minor).expect("dev");
    let agent = agent(&scratch, &f, &[]).await;
    let vol = disk.vol();
    let staging = agent.work.join("staging");
    let stage = |volume_id: &str| {
        let mut r = stage_req(
            &vol,
            &staging,
            mount_cap("ext4", Mode::MultiNodeMultiWriter),
        );
        let mut ctx: HashMap<String, String> = disk.publish_context();
        ctx.insert("volumeID".into(), volume_id.into());
        r.publish_context = ctx;
        r
    };
    let before = checksum(&disk.dev);
    let mut node = agent.node().await;
    let e = node
        .node_stage_volume(stage("vol-0fedcba9876543210"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("vol0123456789abcdef0"), "{e:?}");
    assert_eq!(checksum(&disk.dev), before, "nothing written");
    assert!(mounts_below(&agent.work).is_empty());

    node.node_stage_volume(stage("vol-0123456789abcdef0"))
        .await
        .expect("the disk whose serial the volumeID gives");
    let target = agent.work.join("pods/p/mount");
    node.node_publish_volume(publish_req(
        &vol,
        &staging,
        &target,
        mount_cap("ext4", Mode::MultiNodeMultiWriter),
        false,
    ))
    .await
    .expect("publish");
    std::fs::write(target.join("x"), b"on ebs").unwrap();
    node.node_unpublish_volume(unpublish_req(&vol, &target))
        .await
        .expect("unpublish");
    node.node_unstage_volume(unstage_req(&vol, &staging))
        .await
        .expect("unstage");
    assert!(mounts_below(&agent.work).is_empty());
    assert_eq!(
        fs_uuid(&vol.device).len(),
        36,
        "an ext4 made on the blank disk"
    );

    // Without a serial the disk cannot say which volume it is: the handle decides, as upstream.
    let mut r = stage_req(
        &xen.vol(),
        &staging,
        mount_cap("ext4", Mode::MultiNodeMultiWriter),
    );
    r.publish_context
        .insert("volumeID".into(), "vol-0fedcba9876543210".into());
    node.node_stage_volume(r)
        .await
        .expect("a serial-less disk, taken as the handle names it");
    node.node_unstage_volume(unstage_req(&xen.vol(), &staging))
        .await
        .expect("unstage");
}

/// The agent with the ebs backend on the fixture's sysfs and dev roots, node mode, IMDS off.
pub(super) async fn agent(scratch: &Scratch, f: &Fixture, extra: &[&str]) -> Agent {
    let (sys, dev) = (f.sys_root(), f.dev_root());
    let mut args: Vec<String> = [
        "--backend",
        "ebs",
        "--mode",
        "node",
        "--node-id",
        "i-0123456789abcdef0",
        "--zone",
        "us-east-1a",
        "--imds-disabled",
        "--device-wait",
        "1ms",
    ]
    .iter()
    .chain(extra)
    .map(|s| s.to_string())
    .collect();
    args.extend([
        "--sysfs-root".to_string(),
        sys.display().to_string(),
        "--dev-root".to_string(),
        dev.display().to_string(),
    ]);
    Agent::start(
        scratch,
        AgentOpts {
            args,
            ..Default::default()
        },
    )
    .await
}
