//! Issue 49, found by a real kubelet: for a block volume kubelet asks NodeGetVolumeStats at its
//! own bind of the publication (`…/volumeDevices/<pv>/dev/<pod uid>`), a path no record names.
//! The place is recognised by what it is (a bind of the staged device, or of the read-only device
//! over it), not by its name; anything else there stays NOT_FOUND.

use super::*;
use csi::volume_capability::access_mode::Mode;
use tonic::Code;

/// kubelet's bind of `publication` at `at` (a file it makes first).
fn kubelet_bind(publication: &Path, at: &Path) {
    std::fs::create_dir_all(at.parent().unwrap()).unwrap();
    std::fs::File::create(at).unwrap();
    sh(&format!(
        "mount --bind '{}' '{}'",
        publication.display(),
        at.display()
    ));
}

/// Detaches, even when the test fails, the read-only loop devices laid over `device` (their
/// backing file is a device, not below the scratch directory, so its clean-up misses them); a
/// device still bound only gets autoclear and goes with its last mount.
struct Overlays(String);

impl Drop for Overlays {
    fn drop(&mut self) {
        let Ok(entries) = std::fs::read_dir("/sys/block") else {
            return;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let backing = std::fs::read_to_string(e.path().join("loop/backing_file"));
            if name.starts_with("loop") && backing.is_ok_and(|b| b.trim() == self.0) {
                detach_loop(&Path::new("/dev").join(name));
            }
        }
    }
}

#[tokio::test]
async fn block_stats_answer_at_kubelets_own_bind_of_the_device() {
    if !require_root("block_stats_answer_at_kubelets_own_bind_of_the_device") {
        return;
    }
    let scratch = Scratch::new("stats-kubelet-bind");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let cap = block_cap(Mode::SingleNodeMultiWriter);
    let p = placed(&agent, "kb", 32 * MIB, cap.clone()).await;
    let devices = agent.work.join("k/plugins/kubernetes.io/csi/volumeDevices");
    let at = devices.join("pv-kb/dev/pod-1");
    kubelet_bind(&p.target, &at);
    let s = stats(&agent, &p.vol.id, &at)
        .await
        .expect("stats at kubelet's bind of the published device");
    assert_eq!(s.usage.len(), 1);
    assert_eq!(s.usage[0].total, 32 * MIB);
    assert!(!condition(&s).0, "{:?}", condition(&s));

    // A read-only publication binds the read-only device laid over the volume's.
    let _overlays = Overlays(p.vol.device.clone());
    let ro_target = agent.work.join("k/pods/kb-ro/dev");
    std::fs::create_dir_all(ro_target.parent().unwrap()).unwrap();
    agent
        .node()
        .await
        .node_publish_volume(publish_req(&p.vol, &p.staging, &ro_target, cap, true))
        .await
        .expect("read-only publish");
    let ro_at = devices.join("pv-kb/dev/pod-2");
    kubelet_bind(&ro_target, &ro_at);
    let s = stats(&agent, &p.vol.id, &ro_at)
        .await
        .expect("read-only bind");
    assert_eq!(s.usage[0].total, 32 * MIB);

    // Another volume's device, a plain file, nothing at all: not this volume's place.
    let other = placed(&agent, "other", 32 * MIB, block_cap(Mode::SingleNodeWriter)).await;
    let other_at = devices.join("pv-other/dev/pod-3");
    kubelet_bind(&other.target, &other_at);
    let plain = devices.join("pv-kb/dev/plain");
    std::fs::File::create(&plain).unwrap();
    for path in [other_at, plain, devices.join("pv-kb/dev/missing")] {
        let e = stats(&agent, &p.vol.id, &path)
            .await
            .expect_err("not the volume's device");
        assert_eq!(e.code(), Code::NotFound, "{}: {e:?}", path.display());
    }
    // Outside every allowed prefix, whatever is there.
    let outside = scratch.join("outside/dev");
    kubelet_bind(&p.target, &outside);
    let e = stats(&agent, &p.vol.id, &outside)
        .await
        .expect_err("outside the prefixes");
    assert!(
        matches!(e.code(), Code::NotFound | Code::InvalidArgument),
        "{e:?}"
    );
    for at in [&outside, &ro_at] {
        sh(&format!("umount '{}'", at.display()));
    }
    agent
        .node()
        .await
        .node_unpublish_volume(unpublish_req(&p.vol, &ro_target))
        .await
        .expect("unpublish the read-only publication");
}
