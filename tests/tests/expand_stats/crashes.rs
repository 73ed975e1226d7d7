//! The loop controller's records against what a crash leaves (a twenty-first fresh review's F1
//! and F3): a file grown before its record, and a device attached before its record.

use super::*;
use csi::volume_capability::access_mode::Mode;

/// ControllerExpandVolume killed between growing the file and writing the record leaves the file
/// longer than the record says. A smaller retry (Kubernetes' recovery from a failed expansion
/// allows one) never shrinks it under the mounted filesystem: the answer is the file's size.
#[tokio::test]
async fn a_smaller_expansion_after_a_crash_never_shrinks_the_file() {
    if !require_root("a_smaller_expansion_after_a_crash_never_shrinks_the_file") {
        return;
    }
    let scratch = Scratch::new("expand-after-crash");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let cap = mount_cap("ext4", Mode::SingleNodeWriter);
    let p = placed(&agent, "grown", 64 * MIB, cap).await;
    let file = agent.state_dir.join(format!("volumes/{}.img", p.vol.id));
    // What the killed expansion left: the file at 128 MiB, the record at 64.
    sh(&format!("truncate -s {} {}", 128 * MIB, file.display()));
    let r = controller_expand(&agent, &p, 96 * MIB).await;
    let len = std::fs::metadata(&file).expect("the file").len();
    assert_eq!(
        len,
        128 << 20,
        "the volume's file was shrunk to {len} bytes"
    );
    assert_eq!(r.capacity_bytes, 128 * MIB, "{r:?}");
}

/// ControllerPublishVolume killed between `losetup` and its record leaves a device over the
/// file under this agent's own name for the volume. The retried attach takes it as the agent's:
/// ControllerUnpublishVolume detaches it, and DeleteVolume is not refused for good.
#[tokio::test]
async fn a_device_an_attach_made_before_its_record_is_the_agents() {
    if !require_root("a_device_an_attach_made_before_its_record_is_the_agents") {
        return;
    }
    let scratch = Scratch::new("attach-before-record");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let id = create_volume(&agent, "orphan", 64 * MIB, &[]).await;
    let file = agent.state_dir.join(format!("volumes/{id}.img"));
    let instance = std::fs::read_to_string(agent.state_dir.join("instance-id")).expect("id");
    let instance = u64::from_str_radix(instance.trim(), 16).expect("hex");
    let tag = ebs_node_core::node::ro_tag::AgentTag::new(instance, std::path::Path::new("/"));
    let dev = String::from_utf8_lossy(&sh(&format!("losetup -f --show {}", file.display())).stdout)
        .trim()
        .to_string();
    let device = std::path::Path::new(&dev);
    let _gone = DetachIfLeft(dev.clone(), file.clone());
    ebs_node_host::loopdev::rename(device, &tag.attached_tag(&id)).expect("name it");
    let v = attach(&agent, &id).await;
    assert_eq!(
        v.device, dev,
        "the attach did not take the device it had made"
    );
    let node_name = node_id(&agent).await;
    let mut c = agent.controller().await;
    c.controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
        volume_id: id.clone(),
        node_id: node_name,
        ..Default::default()
    })
    .await
    .expect("detach");
    wait_detached(device);
    c.delete_volume(csi::DeleteVolumeRequest {
        volume_id: id.clone(),
        ..Default::default()
    })
    .await
    .expect("the volume is deleted");
}

fn wait_detached(device: &std::path::Path) {
    let name = device.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let bound = format!("/sys/block/{name}/loop/backing_file");
    let until = Instant::now() + Duration::from_secs(10);
    while std::path::Path::new(&bound).exists() {
        assert!(
            Instant::now() < until,
            "{} is still bound",
            device.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Detaches the test's device if the agent left it (still over the volume's file: a number
/// freed meanwhile may be another test's device now).
struct DetachIfLeft(String, std::path::PathBuf);

impl Drop for DetachIfLeft {
    fn drop(&mut self) {
        let name = self.0.trim_start_matches("/dev/");
        let bound = std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file"));
        if bound.is_ok_and(|b| std::path::Path::new(b.trim()) == self.1) {
            let _ = std::process::Command::new("losetup")
                .args(["-d", &self.0])
                .output();
        }
    }
}

/// Start-up re-attaches every volume it can: one whose file cannot be attached (made immutable)
/// no longer stops it, so the volumes after it are re-attached and their records true (a
/// twenty-first fresh review's F2; a stale record then named a number another filesystem had,
/// and start-up thawed that filesystem).
#[tokio::test]
async fn one_volume_that_cannot_be_reattached_leaves_the_others_attached() {
    if !require_root("one_volume_that_cannot_be_reattached_leaves_the_others_attached") {
        return;
    }
    let scratch = Scratch::new("reattach-past-one");
    let mut agent = Agent::start(&scratch, AgentOpts::default()).await;
    let mut ids = Vec::new();
    for name in ["first", "second"] {
        let id = create_volume(&agent, name, 64 * MIB, &[]).await;
        attach(&agent, &id).await;
        ids.push(id);
    }
    ids.sort();
    let file = |id: &str| agent.state_dir.join(format!("volumes/{id}.img"));
    let (stuck, other) = (file(&ids[0]), file(&ids[1]));
    agent.kill();
    // A reboot: the devices are gone.
    for f in [&stuck, &other] {
        sh(&format!(
            "losetup -j {} -O NAME -n | xargs -r -n1 losetup -d",
            f.display()
        ));
    }
    sh(&format!("chattr +i {}", stuck.display()));
    let _mutable = Mutable(stuck.clone());
    agent.restart(None).await;
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let out = sh(&format!("losetup -j {} -O NAME -n", other.display()));
        if !out.stdout.is_empty() {
            break;
        }
        assert!(
            Instant::now() < until,
            "the volume after the stuck one was not re-attached:\n{}",
            agent.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Makes the file mutable again, so the scratch directory can go.
struct Mutable(std::path::PathBuf);

impl Drop for Mutable {
    fn drop(&mut self) {
        let _ = std::process::Command::new("chattr")
            .arg("-i")
            .arg(&self.0)
            .output();
    }
}
