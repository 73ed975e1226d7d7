//! Online expansion and volume stats/condition on real loop devices, ext4 and xfs: grow mounted
//! filesystems under a writer, then break volumes behind the agent's back and read the condition.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ebs_tests::csi_req::*;
use ebs_tests::*;

use csi::volume_capability::access_mode::Mode;
use csi::volume_usage::Unit;
use tonic::Code;

const MIB: i64 = 1 << 20;

struct Placed {
    vol: Vol,
    staging: PathBuf,
    target: PathBuf,
    cap: csi::VolumeCapability,
}

/// Creates, attaches, stages and publishes a volume; paths live under the agent's state dir
/// (always an allowed prefix).
async fn placed(agent: &Agent, name: &str, bytes: i64, cap: csi::VolumeCapability) -> Placed {
    let vol = create_attached(agent, name, bytes).await;
    let staging = agent.state_dir.join(format!("k/staging/{name}"));
    let target = agent.state_dir.join(format!("k/pods/{name}/mount"));
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

async fn controller_expand(
    agent: &Agent,
    p: &Placed,
    bytes: i64,
) -> csi::ControllerExpandVolumeResponse {
    agent
        .controller()
        .await
        .controller_expand_volume(csi::ControllerExpandVolumeRequest {
            volume_id: p.vol.id.clone(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: bytes,
                limit_bytes: 0,
            }),
            volume_capability: Some(p.cap.clone()),
            ..Default::default()
        })
        .await
        .expect("controller expand")
        .into_inner()
}

fn node_expand_req(
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

async fn stats(
    agent: &Agent,
    id: &str,
    path: &Path,
) -> Result<csi::NodeGetVolumeStatsResponse, tonic::Status> {
    agent
        .node()
        .await
        .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
            volume_id: id.into(),
            volume_path: path.display().to_string(),
            staging_target_path: String::new(),
        })
        .await
        .map(|r| r.into_inner())
}

fn condition(r: &csi::NodeGetVolumeStatsResponse) -> (bool, String) {
    let c = r
        .volume_condition
        .clone()
        .expect("volume_condition is always set");
    (c.abnormal, c.message)
}

fn has_sys_resource() -> bool {
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
async fn abnormal_condition(agent: &Agent, id: &str, path: &Path) -> (bool, String) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let c = condition(&stats(agent, id, path).await.unwrap());
        if c.0 || Instant::now() > deadline {
            return c;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn device_size(dev: &str) -> i64 {
    let out = sh(&format!("blockdev --getsize64 {dev}"));
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

fn statvfs_bytes(path: &Path) -> (i64, i64, i64) {
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
fn start_writer(path: PathBuf, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<u64> {
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

fn check_writer_file(path: &Path, written: u64) {
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

async fn grow_mounted(fs: &str, from: i64, to: i64) {
    let scratch = Scratch::new(&format!("grow-{fs}"));
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let p = placed(
        &agent,
        &format!("grow-{fs}"),
        from,
        mount_cap(fs, Mode::SingleNodeWriter),
    )
    .await;
    let data = p.target.join("data.bin");
    sh(&format!(
        "head -c {} /dev/urandom > {}",
        8 * MIB,
        data.display()
    ));
    let before = checksum(&data);
    let (total_before, _, _) = statvfs_bytes(&p.target);

    let stop = Arc::new(AtomicBool::new(false));
    let writer = start_writer(p.target.join("log.txt"), Arc::clone(&stop));
    tokio::time::sleep(Duration::from_millis(200)).await;

    let c = controller_expand(&agent, &p, to).await;
    assert_eq!(c.capacity_bytes, to);
    assert!(
        c.node_expansion_required,
        "a filesystem volume needs the node to grow it"
    );
    let mut node = agent.node().await;
    let started = Instant::now();
    let r = node
        .node_expand_volume(node_expand_req(&p, &p.target, to, 0))
        .await;
    if fs != "xfs" && !has_sys_resource() {
        // The kernel grows a mounted ext4 only for CAP_SYS_RESOURCE; some sandboxes drop it.
        let err = r.unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
        assert!(err.message().contains("CAP_SYS_RESOURCE"), "{err:?}");
        stop.store(true, Ordering::Relaxed);
        check_writer_file(&p.target.join("log.txt"), writer.join().unwrap());
        assert_eq!(checksum(&data), before);
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("online {fs} growth needs CAP_SYS_RESOURCE and CI=true: refusing to skip");
        }
        eprintln!(
            "SKIPPED online {fs} growth: this host lacks CAP_SYS_RESOURCE (the refusal was checked)"
        );
        return;
    }
    let r = r.expect("node expand").into_inner();
    let grow_ms = started.elapsed().as_millis();
    assert_eq!(r.capacity_bytes, to, "the answer is the device's new size");
    assert_eq!(device_size(&p.vol.device), to);

    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::Relaxed);
    let written = writer.join().unwrap();
    assert!(written > 0);
    check_writer_file(&p.target.join("log.txt"), written);
    assert_eq!(checksum(&data), before, "the data survived the grow");

    let (total_after, _, _) = statvfs_bytes(&p.target);
    assert!(total_after > total_before, "{total_after} > {total_before}");
    // statvfs leaves out the filesystem's own metadata (xfs: its whole log), so compare growth:
    // nearly all of the added bytes are usable.
    let added = total_after - total_before;
    assert!(
        added as f64 > (to - from) as f64 * 0.9 && total_after <= to,
        "statvfs total {total_before} -> {total_after} for {from} -> {to}"
    );
    eprintln!(
        "{fs}: grew {from} -> {to} bytes in {grow_ms} ms; statvfs total {total_before} -> {total_after}"
    );

    // A second identical call is a no-op success: nothing is grown again.
    let again = node
        .node_expand_volume(node_expand_req(&p, &p.target, to, 0))
        .await
        .expect("second node expand")
        .into_inner();
    assert_eq!(again.capacity_bytes, to);
    assert_eq!(statvfs_bytes(&p.target).0, total_after);
    let log = agent.log_text();
    let grown: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("expanded") && l.contains(&p.vol.id))
        .collect();
    assert_eq!(grown.len(), 2, "{grown:?}");
    assert!(
        grown[0].contains("grown=true") && grown[1].contains("grown=false"),
        "{grown:?}"
    );
    // The staging path is an accepted volume_path too.
    let via_staging = node
        .node_expand_volume(node_expand_req(&p, &p.staging, to, 0))
        .await
        .expect("expand via staging path")
        .into_inner();
    assert_eq!(via_staging.capacity_bytes, to);

    // Stats equal statvfs of the mount.
    let s = stats(&agent, &p.vol.id, &p.target).await.unwrap();
    assert_eq!(condition(&s), (false, "volume is healthy".to_string()));
    let bytes = s
        .usage
        .iter()
        .find(|u| u.unit == Unit::Bytes as i32)
        .unwrap();
    let (total, available, used) = statvfs_bytes(&p.target);
    assert_eq!(
        (bytes.total, bytes.available, bytes.used),
        (total, available, used)
    );
    let inodes = s
        .usage
        .iter()
        .find(|u| u.unit == Unit::Inodes as i32)
        .unwrap();
    let st = nix::sys::statvfs::statvfs(&p.target).unwrap();
    assert_eq!(inodes.total, st.files() as i64);
    assert_eq!(inodes.used, (st.files() - st.files_free()) as i64);
}

#[tokio::test]
async fn grow_mounted_ext4_under_a_writer() {
    if !require_root("grow_mounted_ext4_under_a_writer") {
        return;
    }
    grow_mounted("ext4", 64 * MIB, 160 * MIB).await;
}

#[tokio::test]
async fn grow_mounted_xfs_under_a_writer() {
    if !require_root("grow_mounted_xfs_under_a_writer") {
        return;
    }
    // mkfs.xfs refuses filesystems under 300 MB.
    grow_mounted("xfs", 320 * MIB, 512 * MIB).await;
}

#[tokio::test]
async fn block_expand_and_stats_answer_the_device_size() {
    if !require_root("block_expand_and_stats_answer_the_device_size") {
        return;
    }
    let scratch = Scratch::new("grow-block");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let p = placed(
        &agent,
        "grow-block",
        32 * MIB,
        block_cap(Mode::SingleNodeWriter),
    )
    .await;
    let s = stats(&agent, &p.vol.id, &p.target).await.unwrap();
    assert_eq!(s.usage.len(), 1);
    assert_eq!(s.usage[0].total, 32 * MIB);
    assert_eq!(s.usage[0].unit, Unit::Bytes as i32);
    assert!(!condition(&s).0, "{:?}", condition(&s));

    let c = controller_expand(&agent, &p, 48 * MIB).await;
    assert!(
        !c.node_expansion_required,
        "a block volume needs no filesystem work"
    );
    let r = agent
        .node()
        .await
        .node_expand_volume(node_expand_req(&p, &p.target, 48 * MIB, 0))
        .await
        .expect("block node expand")
        .into_inner();
    assert_eq!(r.capacity_bytes, 48 * MIB);
    assert_eq!(device_size(&p.vol.device), 48 * MIB);
    for path in [&p.target, &p.staging] {
        let s = stats(&agent, &p.vol.id, path).await.unwrap();
        assert_eq!(
            s.usage[0].total,
            device_size(&p.vol.device),
            "{}",
            path.display()
        );
        assert!(!condition(&s).0);
    }
}

#[tokio::test]
async fn expand_and_stats_refuse_bad_requests() {
    if !require_root("expand_and_stats_refuse_bad_requests") {
        return;
    }
    let scratch = Scratch::new("expand-errors");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let p = placed(
        &agent,
        "errs",
        32 * MIB,
        mount_cap("ext4", Mode::SingleNodeWriter),
    )
    .await;
    let mut node = agent.node().await;
    let code = |r: Result<tonic::Response<csi::NodeExpandVolumeResponse>, tonic::Status>| {
        r.unwrap_err().code()
    };

    assert_eq!(
        code(
            node.node_expand_volume(node_expand_req(&p, &p.target, 64 * MIB, 48 * MIB))
                .await
        ),
        Code::OutOfRange
    );
    // The controller has not grown the volume: the device cannot satisfy the range.
    assert_eq!(
        code(
            node.node_expand_volume(node_expand_req(&p, &p.target, 64 * MIB, 0))
                .await
        ),
        Code::OutOfRange
    );
    let mut unknown = node_expand_req(&p, &p.target, 0, 0);
    unknown.volume_id = "lv-unknown".into();
    assert_eq!(code(node.node_expand_volume(unknown).await), Code::NotFound);
    let elsewhere = agent.state_dir.join("k/pods/other/mount");
    assert_eq!(
        code(
            node.node_expand_volume(node_expand_req(&p, &elsewhere, 0, 0))
                .await
        ),
        Code::NotFound
    );
    let mut as_block = node_expand_req(&p, &p.target, 0, 0);
    as_block.volume_capability = Some(block_cap(Mode::SingleNodeWriter));
    assert_eq!(
        code(node.node_expand_volume(as_block).await),
        Code::InvalidArgument
    );
    let mut no_path = node_expand_req(&p, &p.target, 0, 0);
    no_path.volume_path = String::new();
    assert_eq!(
        code(node.node_expand_volume(no_path).await),
        Code::InvalidArgument
    );

    let mut c = agent.controller().await;
    let cexp = |req: i64, lim: i64| csi::ControllerExpandVolumeRequest {
        volume_id: p.vol.id.clone(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: req,
            limit_bytes: lim,
        }),
        ..Default::default()
    };
    assert_eq!(
        c.controller_expand_volume(cexp(64 * MIB, 48 * MIB))
            .await
            .unwrap_err()
            .code(),
        Code::OutOfRange
    );
    assert_eq!(
        c.controller_expand_volume(cexp(MIB, 16 * MIB))
            .await
            .unwrap_err()
            .code(),
        Code::OutOfRange,
        "no shrink"
    );
    let same = c
        .controller_expand_volume(cexp(16 * MIB, 0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        same.capacity_bytes,
        32 * MIB,
        "already large enough: a no-op"
    );

    // Stats: unknown volume, unknown path.
    assert_eq!(
        stats(&agent, "lv-unknown", &p.target)
            .await
            .unwrap_err()
            .code(),
        Code::NotFound
    );
    assert_eq!(
        stats(&agent, &p.vol.id, &elsewhere)
            .await
            .unwrap_err()
            .code(),
        Code::NotFound
    );

    // Staged but not mounted any more (as after a reboot): expansion cannot run.
    node.node_unpublish_volume(unpublish_req(&p.vol, &p.target))
        .await
        .unwrap();
    sh(&format!("umount {}", p.staging.display()));
    assert_eq!(
        code(
            node.node_expand_volume(node_expand_req(&p, &p.staging, 0, 0))
                .await
        ),
        Code::FailedPrecondition
    );

    let caps = node
        .node_get_capabilities(csi::NodeGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    let rpcs: Vec<i32> = caps
        .capabilities
        .iter()
        .filter_map(|c| match &c.r#type {
            Some(csi::node_service_capability::Type::Rpc(r)) => Some(r.r#type),
            _ => None,
        })
        .collect();
    use csi::node_service_capability::rpc::Type;
    for t in [
        Type::StageUnstageVolume,
        Type::GetVolumeStats,
        Type::ExpandVolume,
        Type::VolumeCondition,
        Type::SingleNodeMultiWriter,
    ] {
        assert!(rpcs.contains(&(t as i32)), "{t:?} in {rpcs:?}");
    }
}

fn wait_detached(dev: &str) {
    let name = dev.trim_start_matches("/dev/");
    let deadline = Instant::now() + Duration::from_secs(10);
    while Path::new(&format!("/sys/block/{name}/loop/backing_file")).exists() {
        assert!(Instant::now() < deadline, "{dev} is still attached");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn volume_file(agent: &Agent, p: &Placed) -> PathBuf {
    agent.state_dir.join(format!("volumes/{}.img", p.vol.id))
}

#[tokio::test]
async fn conditions_are_reported_for_real_breakage() {
    if !require_root("conditions_are_reported_for_real_breakage") {
        return;
    }
    let scratch = Scratch::new("conditions");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let ext4 = || mount_cap("ext4", Mode::SingleNodeWriter);

    // Healthy.
    let healthy = placed(&agent, "healthy", 32 * MIB, ext4()).await;
    let s = stats(&agent, &healthy.vol.id, &healthy.target)
        .await
        .unwrap();
    assert_eq!(condition(&s), (false, "volume is healthy".to_string()));
    assert!(
        !condition(
            &stats(&agent, &healthy.vol.id, &healthy.staging)
                .await
                .unwrap()
        )
        .0
    );

    // The publication's mount is lazily unmounted behind the agent's back.
    let lazy = placed(&agent, "lazy", 32 * MIB, ext4()).await;
    sh(&format!("umount -l {}", lazy.target.display()));
    let s = stats(&agent, &lazy.vol.id, &lazy.target).await.unwrap();
    let (abnormal, msg) = condition(&s);
    assert!(abnormal && msg.contains("no longer mounted at"), "{msg}");
    assert!(s.usage.is_empty(), "nothing to measure: {:?}", s.usage);
    eprintln!("mount gone: {msg}");

    // The kernel remounts the filesystem read-only after an error (errors=remount-ro)...
    let ro = placed(
        &agent,
        "ro",
        32 * MIB,
        mount_cap_flags("ext4", Mode::SingleNodeWriter, &["errors=remount-ro"]),
    )
    .await;
    let dev_name = ro.vol.device.trim_start_matches("/dev/");
    std::fs::write(
        format!("/sys/fs/ext4/{dev_name}/trigger_fs_error"),
        "test: simulated error\n",
    )
    .unwrap();
    let (abnormal, msg) = abnormal_condition(&agent, &ro.vol.id, &ro.target).await;
    assert!(
        abnormal && msg.contains("read-only although it was mounted read-write"),
        "{msg}"
    );
    assert!(
        std::fs::write(ro.target.join("f"), b"x").is_err(),
        "writes really fail"
    );
    eprintln!("read-only after errors: {msg}");
    // ... or someone remounts it read-only by hand.
    let remounted = placed(&agent, "remounted", 32 * MIB, ext4()).await;
    sh(&format!(
        "mount -o remount,ro {}",
        remounted.staging.display()
    ));
    let (abnormal, msg) = condition(
        &stats(&agent, &remounted.vol.id, &remounted.target)
            .await
            .unwrap(),
    );
    assert!(
        abnormal && msg.contains("read-only although it was mounted read-write"),
        "{msg}"
    );

    // The storage behind the device fails: reads return EIO (the backing file lost its blocks).
    let eio = placed(&agent, "eio", 32 * MIB, ext4()).await;
    std::fs::OpenOptions::new()
        .write(true)
        .open(volume_file(&agent, &eio))
        .unwrap()
        .set_len(0)
        .unwrap();
    let (abnormal, msg) = condition(&stats(&agent, &eio.vol.id, &eio.target).await.unwrap());
    assert!(abnormal && msg.contains("I/O error"), "{msg}");
    eprintln!("I/O error: {msg}");

    // The device disappears: mounts lazily dropped, loop device detached.
    let gone = placed(&agent, "gone", 32 * MIB, ext4()).await;
    sh(&format!(
        "umount -l {} && umount -l {}",
        gone.target.display(),
        gone.staging.display()
    ));
    sh(&format!("losetup -d {}", gone.vol.device));
    wait_detached(&gone.vol.device);
    let (abnormal, msg) = condition(&stats(&agent, &gone.vol.id, &gone.target).await.unwrap());
    // Another test on this host may grab the freed loop device at once: then it carries another
    // file, which is reported as such.
    assert!(
        abnormal && (msg.contains("has disappeared") || msg.contains("no longer carries")),
        "{msg}"
    );
    assert!(msg.contains("no longer mounted"), "{msg}");
    eprintln!("device gone: {msg}");

    // Same device node, same mount point, another backing file: a copy of the volume.
    let swap = placed(&agent, "swap", 32 * MIB, ext4()).await;
    sh(&format!(
        "umount -l {} && umount -l {}",
        swap.target.display(),
        swap.staging.display()
    ));
    sh(&format!("losetup -d {}", swap.vol.device));
    wait_detached(&swap.vol.device);
    let copy = scratch.join("swap-copy.img");
    sh(&format!(
        "cp --sparse=always {} {}",
        volume_file(&agent, &swap).display(),
        copy.display()
    ));
    sh(&format!("losetup {} {}", swap.vol.device, copy.display()));
    sh(&format!(
        "mount {} {}",
        swap.vol.device,
        swap.staging.display()
    ));
    let (abnormal, msg) = condition(&stats(&agent, &swap.vol.id, &swap.staging).await.unwrap());
    assert!(
        abnormal && msg.contains("no longer carries volume"),
        "{msg}"
    );
    assert!(
        !msg.contains("no longer mounted"),
        "the mount itself is there: {msg}"
    );
    eprintln!("identity swapped: {msg}");

    // The healthy volume stayed healthy through all of this.
    assert!(
        !condition(
            &stats(&agent, &healthy.vol.id, &healthy.target)
                .await
                .unwrap()
        )
        .0
    );
}

#[tokio::test]
async fn stats_do_not_wait_for_the_volume_guard() {
    if !require_root("stats_do_not_wait_for_the_volume_guard") {
        return;
    }
    let scratch = Scratch::new("stats-concurrent");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let p = placed(
        &agent,
        "busy",
        320 * MIB,
        mount_cap("xfs", Mode::SingleNodeWriter),
    )
    .await;
    controller_expand(&agent, &p, 2048 * MIB).await;
    // Stats calls run while the expansion (which holds the guard) is in flight; none is ABORTED.
    let mut node = agent.node().await;
    let expand = tokio::spawn({
        let req = node_expand_req(&p, &p.target, 2048 * MIB, 0);
        let mut n = agent.node().await;
        async move { n.node_expand_volume(req).await }
    });
    let mut calls = 0;
    while !expand.is_finished() || calls == 0 {
        let r = node
            .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
                volume_id: p.vol.id.clone(),
                volume_path: p.target.display().to_string(),
                staging_target_path: String::new(),
            })
            .await;
        assert!(r.is_ok(), "{r:?}");
        calls += 1;
    }
    expand.await.unwrap().expect("expand");
    eprintln!("{calls} stats calls answered during one expansion");
}
