//! Online expansion and volume stats/condition on real loop devices, ext4 and xfs: grow mounted
//! filesystems under a writer, then break volumes behind the agent's back and read the condition.

mod conditions;
mod crashes;
mod grow;
mod kubelet_bind;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ebs_tests::csi_req::*;
use ebs_tests::*;

pub const MIB: i64 = 1 << 20;

pub struct Placed {
    pub vol: Vol,
    pub staging: PathBuf,
    pub target: PathBuf,
    pub cap: csi::VolumeCapability,
}

/// Creates, attaches, stages and publishes a volume; paths live under the agent's state dir
/// (always an allowed prefix).
pub async fn placed(agent: &Agent, name: &str, bytes: i64, cap: csi::VolumeCapability) -> Placed {
    let vol = create_attached(agent, name, bytes).await;
    let staging = agent.work.join(format!("k/staging/{name}"));
    let target = agent.work.join(format!("k/pods/{name}/mount"));
    std::fs::create_dir_all(target.parent().unwrap()).unwrap();
    let mut node = agent.node().await;
    node.node_stage_volume(stage_req(&vol, &staging, cap.clone()))
        .await
        .expect("stage");
    node.node_publish_volume(publish_req(&vol, &staging, &target, cap.clone(), false))
        .await
        .expect("publish");
    Placed {
        vol,
        staging,
        target,
        cap,
    }
}

pub async fn controller_expand(
    agent: &Agent,
    p: &Placed,
    bytes: i64,
) -> csi::ControllerExpandVolumeResponse {
    agent
        .expand_on_controller(&p.vol.id, bytes, Some(p.cap.clone()))
        .await
        .expect("controller expand")
}

pub fn node_expand_req(
    p: &Placed,
    path: &Path,
    required: i64,
    limit: i64,
) -> csi::NodeExpandVolumeRequest {
    csi::NodeExpandVolumeRequest {
        volume_id: p.vol.id.clone(),
        volume_path: path.display().to_string(),
        staging_target_path: p.staging.display().to_string(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: required,
            limit_bytes: limit,
        }),
        volume_capability: Some(p.cap.clone()),
        ..Default::default()
    }
}

pub async fn stats(
    agent: &Agent,
    id: &str,
    path: &Path,
) -> Result<csi::NodeGetVolumeStatsResponse, tonic::Status> {
    agent
        .node()
        .await
        .node_get_volume_stats(stats_req(id, path))
        .await
        .map(|r| r.into_inner())
}

pub fn condition(r: &csi::NodeGetVolumeStatsResponse) -> (bool, String) {
    let c = r
        .volume_condition
        .clone()
        .expect("volume_condition is always set");
    (c.abnormal, c.message)
}

pub fn has_sys_resource() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .unwrap()
        .trim();
    u64::from_str_radix(eff, 16).unwrap() & (1 << 24) != 0 // CAP_SYS_RESOURCE = 24
}

/// Asks for stats until the condition turns abnormal (some breakage lands asynchronously, e.g.
/// ext4's remount-ro after an error), up to a few seconds.
pub async fn abnormal_condition(agent: &Agent, id: &str, path: &Path) -> (bool, String) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let c = condition(&stats(agent, id, path).await.unwrap());
        if c.0 || Instant::now() > deadline {
            return c;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub fn device_size(dev: &str) -> i64 {
    let out = sh(&format!("blockdev --getsize64 {dev}"));
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

pub fn statvfs_bytes(path: &Path) -> (i64, i64, i64) {
    let st = nix::sys::statvfs::statvfs(path).unwrap();
    let f = st.fragment_size() as i64;
    let blocks = st.blocks() as i64;
    (
        blocks * f,
        st.blocks_available() as i64 * f,
        (blocks - st.blocks_free() as i64) * f,
    )
}

/// Appends numbered lines to a file until stopped; returns how many it wrote.
pub fn start_writer(path: PathBuf, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap();
        let mut n = 0u64;
        while !stop.load(Ordering::Relaxed) {
            writeln!(f, "line {n:08} {}", "x".repeat(200)).unwrap();
            n += 1;
            if n.is_multiple_of(64) {
                f.sync_data().unwrap();
            }
        }
        f.sync_all().unwrap();
        n
    })
}

pub fn check_writer_file(path: &Path, written: u64) {
    let text = std::fs::read_to_string(path).unwrap();
    let mut count = 0u64;
    for (i, line) in text.lines().enumerate() {
        assert!(
            line.starts_with(&format!("line {i:08} ")),
            "line {i} is damaged: {line:.40}"
        );
        count += 1;
    }
    assert_eq!(count, written, "every appended line is there");
}

pub fn wait_detached(dev: &str) {
    let name = dev.trim_start_matches("/dev/");
    let deadline = Instant::now() + Duration::from_secs(10);
    while Path::new(&format!("/sys/block/{name}/loop/backing_file")).exists() {
        assert!(Instant::now() < deadline, "{dev} is still attached");
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn volume_file(agent: &Agent, p: &Placed) -> PathBuf {
    agent.state_dir.join(format!("volumes/{}.img", p.vol.id))
}
