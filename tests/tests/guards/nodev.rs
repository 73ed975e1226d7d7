//! A device node on a volume's own filesystem opens nothing: every filesystem staging is mounted
//! `nodev`, whatever the mount options say (`dev` included), and its publications keep it (a
//! fifty-fourth fresh review's F2: a node carried on volume B's filesystem, which any user can
//! put in an image with debugfs, read volume A's bytes as `nobody` through B's publication).

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use ebs_tests::csi_req::*;
use ebs_tests::*;

use csi::volume_capability::access_mode::Mode;
use nix::sys::stat::{Mode as Perm, SFlag, mknod};

use super::MIB;
use super::ro_peer::mount_options;

#[tokio::test]
async fn a_device_node_on_a_volume_opens_nothing() {
    let _ns = crate::NAMESPACE_COPY.read().await;
    if !require_root("a_device_node_on_a_volume_opens_nothing") {
        return;
    }
    let scratch = Scratch::new("g-nodev");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    // A's device is what the node on B names; A needs no staging for its bytes to be read.
    let a = create_attached(&agent, "nodev-a", 64 * MIB).await;
    let b = create_attached(&agent, "nodev-b", 64 * MIB).await;
    let a_dev = std::fs::metadata(&a.device).expect("A's device").rdev();
    let mut node = agent.node().await;
    for (case, flags) in [("plain", &[][..]), ("dev", &["dev"][..])] {
        let staging = agent.work.join(format!("staging/{case}"));
        let cap = || mount_cap_flags("ext4", Mode::SingleNodeWriter, flags);
        node.node_stage_volume(stage_req(&b, &staging, cap()))
            .await
            .unwrap_or_else(|e| panic!("{case}: stage: {e:?}\n{}", agent.log_text()));
        let carried = staging.join("node");
        mknod(
            &carried,
            SFlag::S_IFBLK,
            Perm::from_bits_truncate(0o666),
            a_dev,
        )
        .expect("a block node on the volume");
        let target = agent.work.join(format!("pods/{case}/mount"));
        for readonly in [false, true] {
            node.node_publish_volume(publish_req(&b, &staging, &target, cap(), readonly))
                .await
                .unwrap_or_else(|e| panic!("{case}: publish: {e:?}\n{}", agent.log_text()));
            for place in [&staging, &target] {
                opens_nothing(case, place);
            }
            node.node_unpublish_volume(unpublish_req(&b, &target))
                .await
                .expect("unpublish");
        }
        std::fs::remove_file(&carried).expect("removing the node");
        node.node_unstage_volume(unstage_req(&b, &staging))
            .await
            .expect("unstage");
    }
}

/// The mount at `place` is `nodev`, and the node on it is refused EACCES even to root.
fn opens_nothing(case: &str, place: &Path) {
    let opts = mount_options(place).unwrap_or_default();
    assert!(
        opts.iter().any(|o| o == "nodev"),
        "{case}: {} is not nodev: {opts:?}",
        place.display()
    );
    match std::fs::File::open(place.join("node")) {
        Err(e) if e.raw_os_error() == Some(libc::EACCES) => {}
        other => panic!("{case}: the node at {} opened: {other:?}", place.display()),
    }
}
