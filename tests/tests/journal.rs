//! The crash-safe journal: kill the agent at every step boundary, restart it on the same state,
//! retry, and check that nothing was formatted twice, no data was lost, no mount was stacked.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ebs_tests::csi_req::*;
use ebs_tests::*;

use csi::volume_capability::access_mode::Mode;
use tonic::Code;

fn crash_opts(point: Option<&str>) -> AgentOpts {
    let mut o = AgentOpts::default();
    if let Some(p) = point {
        o.args.push("--crash-after".into());
        o.args.push(p.into());
    }
    o
}

fn mount_count(path: &Path) -> usize {
    mounts_below(path)
        .iter()
        .filter(|m| m.as_path() == path)
        .count()
}

struct Cycle {
    vol: Vol,
    staging: PathBuf,
    target: PathBuf,
    cap: csi::VolumeCapability,
}

impl Cycle {
    /// A volume's staging and target paths under the agent's state dir, mounted as `fs`.
    fn new(agent: &Agent, vol: Vol, name: &str, fs: &str) -> Self {
        Cycle {
            vol,
            staging: agent.state_dir.join(format!("staging/{name}")),
            target: agent.state_dir.join(format!("pods/{name}/mount")),
            cap: mount_cap(fs, Mode::SingleNodeWriter),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Op {
    Stage,
    Publish,
    Unpublish,
    Unstage,
}

async fn call(agent: &Agent, c: &Cycle, op: Op) -> Result<(), tonic::Status> {
    let mut node = agent.node().await;
    match op {
        Op::Stage => node
            .node_stage_volume(stage_req(&c.vol, &c.staging, c.cap.clone()))
            .await
            .map(drop),
        Op::Publish => node
            .node_publish_volume(publish_req(
                &c.vol,
                &c.staging,
                &c.target,
                c.cap.clone(),
                false,
            ))
            .await
            .map(drop),
        Op::Unpublish => node
            .node_unpublish_volume(unpublish_req(&c.vol, &c.target))
            .await
            .map(drop),
        Op::Unstage => node
            .node_unstage_volume(unstage_req(&c.vol, &c.staging))
            .await
            .map(drop),
    }
}

/// Runs the lifecycle up to `op`, crashing the agent right after `point` is journaled during
/// `op`; then restarts, retries `op`, finishes the cycle and checks every invariant.
async fn crash_at(fs: &str, op: Op, point: &str) {
    let scratch = Scratch::new(&format!("crash-{fs}-{}", point.replace('.', "-")));
    let mut agent = Agent::start(&scratch, crash_opts(None)).await;
    let size = if fs == "xfs" { 320 << 20 } else { 64 << 20 };
    let vol = create_attached(&agent, "crash", size).await;
    let c = Cycle::new(&agent, vol, "crash", fs);
    let order = [Op::Stage, Op::Publish, Op::Unpublish, Op::Unstage];
    let pos = order.iter().position(|o| *o == op).unwrap();
    let mut uuid = String::new();
    for done in &order[..pos] {
        call(&agent, &c, *done).await.unwrap();
        if *done == Op::Stage {
            uuid = fs_uuid(&c.vol.device);
        }
        if *done == Op::Publish {
            std::fs::write(c.target.join("before-crash"), b"survives").unwrap();
        }
    }
    // Restart with the fault armed, then run the op: the agent dies at the point.
    agent.restart(Some(crash_opts(Some(point)))).await;
    let result = call(&agent, &c, op).await;
    let status = agent.wait_exit(Duration::from_secs(20)).await;
    assert!(
        status.is_some(),
        "{point}: the agent did not die (result {result:?})"
    );
    assert!(
        result.is_err(),
        "{point}: the call must not have answered OK"
    );

    agent.restart(Some(crash_opts(None))).await;
    call(&agent, &c, op)
        .await
        .unwrap_or_else(|e| panic!("{point}: retry failed: {e:?}\n{}", agent.log_text()));
    // Retrying once more is still fine (idempotent after recovery).
    call(&agent, &c, op).await.unwrap();
    if op == Op::Publish {
        std::fs::write(c.target.join("before-crash"), b"survives").unwrap();
    }
    for next in &order[pos + 1..] {
        if *next == Op::Unpublish {
            assert_eq!(
                std::fs::read(c.target.join("before-crash")).unwrap(),
                b"survives"
            );
        }
        call(&agent, &c, *next).await.unwrap();
        if *next == Op::Publish {
            std::fs::write(c.target.join("before-crash"), b"survives").unwrap();
        }
    }
    assert_eq!(mount_count(&c.staging), 0, "{point}: staging left mounted");
    assert_eq!(mount_count(&c.target), 0, "{point}: target left mounted");
    // Stage once more to read what is on the volume: one filesystem, the first one, data intact.
    call(&agent, &c, Op::Stage).await.unwrap();
    assert_eq!(
        mount_count(&c.staging),
        1,
        "{point}: stacked or missing staging mount"
    );
    if !uuid.is_empty() {
        assert_eq!(fs_uuid(&c.vol.device), uuid, "{point}: formatted again");
    }
    if pos >= 2 {
        assert_eq!(
            std::fs::read(c.staging.join("before-crash")).unwrap(),
            b"survives",
            "{point}"
        );
    }
    let formats = agent.log_text().matches(" formatted").count();
    assert_eq!(
        formats,
        1,
        "{point}: mkfs must run exactly once\n{}",
        agent.log_text()
    );
    call(&agent, &c, Op::Unstage).await.unwrap();
    eprintln!("{point}: recovered");
}

const STAGE_POINTS: &[&str] = &[
    "stage.resolve_device.intent",
    "stage.resolve_device.done",
    "stage.verify_identity.done",
    "stage.probe.intent",
    "stage.probe.done",
    "stage.format.intent",
    "stage.format.done",
    "stage.mount.intent",
    "stage.mount.done",
    "stage.staged.done",
];

#[tokio::test]
async fn crash_matrix_stage_ext4() {
    if !require_root("crash_matrix_stage_ext4") {
        return;
    }
    for p in STAGE_POINTS {
        crash_at("ext4", Op::Stage, p).await;
    }
}

#[tokio::test]
async fn crash_matrix_stage_xfs() {
    if !require_root("crash_matrix_stage_xfs") {
        return;
    }
    for p in STAGE_POINTS {
        crash_at("xfs", Op::Stage, p).await;
    }
}

#[tokio::test]
async fn crash_matrix_publish_unpublish_unstage() {
    if !require_root("crash_matrix_publish_unpublish_unstage") {
        return;
    }
    for (op, p) in [
        (Op::Publish, "publish.bind.intent"),
        (Op::Publish, "publish.bind.done"),
        (Op::Publish, "publish.published.done"),
        (Op::Unpublish, "unpublish.unmount.intent"),
        (Op::Unpublish, "unpublish.unmount.done"),
        (Op::Unpublish, "unpublish.unpublished.done"),
        (Op::Unstage, "unstage.unmount.intent"),
        (Op::Unstage, "unstage.unmount.done"),
        (Op::Unstage, "unstage.unstaged.done"),
    ] {
        crash_at("ext4", op, p).await;
    }
}

/// Stages a volume that is already formatted (the fsck path, where the mount intent is committed
/// while e2fsck runs), crashing at `point`; then retries and checks data, UUID and mounts.
async fn crash_restage_at(point: &str) {
    let scratch = Scratch::new(&format!("crash-restage-{}", point.replace('.', "-")));
    let mut agent = Agent::start(&scratch, crash_opts(None)).await;
    let vol = create_attached(&agent, "restage", 64 << 20).await;
    let c = Cycle::new(&agent, vol, "restage", "ext4");
    call(&agent, &c, Op::Stage).await.unwrap();
    let uuid = fs_uuid(&c.vol.device);
    std::fs::write(c.staging.join("before-crash"), b"survives").unwrap();
    call(&agent, &c, Op::Unstage).await.unwrap();

    agent.restart(Some(crash_opts(Some(point)))).await;
    let result = call(&agent, &c, Op::Stage).await;
    let status = agent.wait_exit(Duration::from_secs(20)).await;
    assert!(
        status.is_some(),
        "{point}: the agent did not die ({result:?})"
    );
    assert!(
        result.is_err(),
        "{point}: the call must not have answered OK"
    );

    agent.restart(Some(crash_opts(None))).await;
    // An e2fsck orphaned by the crash may still hold the device for a moment: the CO retries.
    let mut retry = call(&agent, &c, Op::Stage).await;
    for _ in 0..20 {
        if retry.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        retry = call(&agent, &c, Op::Stage).await;
    }
    retry.unwrap_or_else(|e| panic!("{point}: retry failed: {e:?}\n{}", agent.log_text()));
    call(&agent, &c, Op::Stage).await.unwrap();
    assert_eq!(
        mount_count(&c.staging),
        1,
        "{point}: stacked or missing mount"
    );
    assert_eq!(
        std::fs::read(c.staging.join("before-crash")).unwrap(),
        b"survives",
        "{point}"
    );
    assert_eq!(fs_uuid(&c.vol.device), uuid, "{point}: formatted again");
    call(&agent, &c, Op::Unstage).await.unwrap();
    assert_eq!(mount_count(&c.staging), 0, "{point}: staging left mounted");
    eprintln!("{point} (restage): recovered");
}

#[tokio::test]
async fn crash_matrix_restage_ext4() {
    if !require_root("crash_matrix_restage_ext4") {
        return;
    }
    for p in [
        "stage.probe.done",
        "stage.check.intent",
        "stage.check.done",
        "stage.mount.intent",
        "stage.mount.done",
        "stage.staged.done",
    ] {
        crash_restage_at(p).await;
    }
}

#[tokio::test]
async fn reboot_behind_the_agents_back() {
    if !require_root("reboot_behind_the_agents_back") {
        return;
    }
    let scratch = Scratch::new("reboot");
    let mut agent = Agent::start(&scratch, AgentOpts::default()).await;
    let vol = create_attached(&agent, "reboot", 64 << 20).await;
    let c = Cycle::new(&agent, vol.clone(), "r", "ext4");
    call(&agent, &c, Op::Stage).await.unwrap();
    call(&agent, &c, Op::Publish).await.unwrap();
    std::fs::write(c.target.join("f"), b"kept").unwrap();
    agent.kill();
    // A reboot: every mount and the loop device are gone.
    sh(&format!(
        "umount {} && umount {}",
        c.target.display(),
        c.staging.display()
    ));
    sh(&format!("losetup -d {}", vol.device));
    agent.spawn().await;
    let log = agent.log_text();
    assert!(log.contains("staging mount is gone"), "{log}");
    // Unpublish and unstage of what is already gone answer OK.
    call(&agent, &c, Op::Unpublish).await.unwrap();
    call(&agent, &c, Op::Unstage).await.unwrap();
    // A new cycle works: the controller re-attached the file at start; ask it for the device.
    let vol = attach(&agent, &vol.id).await;
    let c = Cycle { vol, ..c };
    call(&agent, &c, Op::Stage).await.unwrap();
    call(&agent, &c, Op::Publish).await.unwrap();
    assert_eq!(std::fs::read(c.target.join("f")).unwrap(), b"kept");
    call(&agent, &c, Op::Unpublish).await.unwrap();
    call(&agent, &c, Op::Unstage).await.unwrap();
    assert_eq!(agent.log_text().matches(" formatted").count(), 1);
}

#[tokio::test]
async fn swapped_device_is_refused_and_nothing_is_formatted() {
    if !require_root("swapped_device_is_refused_and_nothing_is_formatted") {
        return;
    }
    let scratch = Scratch::new("swap-dev");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let vol = create_attached(&agent, "swap", 64 << 20).await;
    let c = Cycle::new(&agent, vol.clone(), "s", "ext4");
    call(&agent, &c, Op::Stage).await.unwrap();
    call(&agent, &c, Op::Unstage).await.unwrap();
    // Swap the volume's backing file for a blank one under the same path.
    let node = node_id(&agent).await;
    agent
        .controller()
        .await
        .controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
            volume_id: vol.id.clone(),
            node_id: node,
            ..Default::default()
        })
        .await
        .unwrap();
    let file = agent.state_dir.join(format!("volumes/{}.img", vol.id));
    std::fs::remove_file(&file).unwrap();
    let f = std::fs::File::create(&file).unwrap();
    f.set_len(64 << 20).unwrap();
    drop(f);
    let vol = attach(&agent, &vol.id).await;
    let c = Cycle {
        vol: vol.clone(),
        ..c
    };
    let e = call(&agent, &c, Op::Stage).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(
        e.message().contains("wrong device") || e.message().contains("changed"),
        "{}",
        e.message()
    );
    assert_eq!(fs_uuid(&vol.device), "", "nothing formatted");
    assert_eq!(mount_count(&c.staging), 0);
}

#[tokio::test]
async fn corrupt_state_file_is_refused_and_recover_rebuilds_it() {
    if !require_root("corrupt_state_file_is_refused_and_recover_rebuilds_it") {
        return;
    }
    let scratch = Scratch::new("corrupt");
    let mut agent = Agent::start(&scratch, AgentOpts::default()).await;
    let vol = create_attached(&agent, "corrupt", 64 << 20).await;
    let c = Cycle::new(&agent, vol.clone(), "c", "ext4");
    call(&agent, &c, Op::Stage).await.unwrap();
    call(&agent, &c, Op::Publish).await.unwrap();
    agent.kill();
    let state = agent.state_dir.join("state.redb");
    std::fs::write(&state, vec![0x42u8; 64 * 1024]).unwrap();

    let out = std::process::Command::new(agent_bin())
        .args([
            "serve",
            "--backend",
            "loop",
            "--endpoint",
            &agent.endpoint(),
            "--state-dir",
        ])
        .arg(&agent.state_dir)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("corrupt") && err.contains("recover --from-mounts"),
        "{err}"
    );

    let out = std::process::Command::new(agent_bin())
        .args(["recover", "--from-mounts", "--state-dir"])
        .arg(&agent.state_dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("1 staged volume(s) and 1 publication(s)"),
        "{said}"
    );

    agent.spawn().await;
    let (ok, status) = agent.client_json(&["node", "info"]);
    assert!(ok, "{status}");
    let st = std::process::Command::new(agent_bin())
        .args([
            "status",
            "--json",
            "--endpoint",
            &agent.endpoint(),
            "--state-dir",
        ])
        .arg(&agent.state_dir)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&st.stdout).unwrap();
    assert_eq!(v["volumes"][0]["volume_id"], vol.id.as_str(), "{v}");
    // The CO's next calls work on the rebuilt state, without formatting anything.
    call(&agent, &c, Op::Publish).await.unwrap();
    call(&agent, &c, Op::Unpublish).await.unwrap();
    call(&agent, &c, Op::Unstage).await.unwrap();
    call(&agent, &c, Op::Stage).await.unwrap();
    call(&agent, &c, Op::Unstage).await.unwrap();
    let formats = agent.log_text().matches(" formatted").count();
    assert_eq!(
        formats, 1,
        "recovery must not format (the one format is the first stage's)"
    );
}

#[tokio::test]
async fn status_reads_the_stopped_agents_file() {
    if !require_root("status_reads_the_stopped_agents_file") {
        return;
    }
    let scratch = Scratch::new("status");
    let mut agent = Agent::start(&scratch, AgentOpts::default()).await;
    let vol = create_attached(&agent, "st", 64 << 20).await;
    let c = Cycle::new(&agent, vol.clone(), "st", "ext4");
    call(&agent, &c, Op::Stage).await.unwrap();
    let running = std::process::Command::new(agent_bin())
        .args(["status", "--endpoint", &agent.endpoint(), "--state-dir"])
        .arg(&agent.state_dir)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&running.stdout).contains("staged at"));
    agent.terminate().await.unwrap();
    let stopped = std::process::Command::new(agent_bin())
        .args([
            "status",
            "--json",
            "--endpoint",
            &agent.endpoint(),
            "--state-dir",
        ])
        .arg(&agent.state_dir)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&stopped.stdout).unwrap();
    assert_eq!(v["volumes"][0]["last_step"]["step"], "staged");
    // Clean up the mount the stopped agent left (the Scratch guard would too).
    sh(&format!("umount {}", c.staging.display()));
}

/// mkfs killed half-way: the device shows our own half-written filesystem (or only mkfs's
/// metadata, no superblock yet). The retry formats again with the UUID the journal chose; a
/// device showing another filesystem is refused.
#[tokio::test]
async fn interrupted_mkfs_is_redone_only_over_its_own_work() {
    if !require_root("interrupted_mkfs_is_redone_only_over_its_own_work") {
        return;
    }
    for leftover in ["own-superblock", "metadata-only", "foreign"] {
        let scratch = Scratch::new(&format!("mkfs-{leftover}"));
        let mut agent = Agent::start(&scratch, crash_opts(Some("stage.format.intent"))).await;
        let vol = create_attached(&agent, "m", 64 << 20).await;
        let c = Cycle::new(&agent, vol.clone(), "m", "ext4");
        assert!(call(&agent, &c, Op::Stage).await.is_err());
        agent
            .wait_exit(Duration::from_secs(20))
            .await
            .expect("crashed");
        let st = std::process::Command::new(agent_bin())
            .args(["status", "--json", "--state-dir"])
            .arg(&agent.state_dir)
            .args(["--endpoint", &agent.endpoint()])
            .output()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&st.stdout).unwrap();
        let intended = v["volumes"][0]["filesystem"]["uuid"]
            .as_str()
            .unwrap()
            .to_string();
        assert_eq!(v["volumes"][0]["filesystem"]["state"], "intent");
        match leftover {
            "own-superblock" => sh(&format!("mkfs.ext4 -q -F -U {intended} {}", vol.device)),
            "metadata-only" => sh(&format!(
                "head -c 262144 /dev/urandom | dd of={} bs=64k seek=2 conv=notrunc status=none",
                vol.device
            )),
            _ => sh(&format!("mkfs.ext4 -q -F {}", vol.device)),
        };
        let foreign_uuid = fs_uuid(&vol.device);
        agent.restart(Some(crash_opts(None))).await;
        let r = call(&agent, &c, Op::Stage).await;
        if leftover == "foreign" {
            let e = r.unwrap_err();
            assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
            assert_eq!(
                fs_uuid(&vol.device),
                foreign_uuid,
                "the foreign filesystem is untouched"
            );
        } else {
            r.unwrap_or_else(|e| panic!("{leftover}: {e:?}"));
            assert_eq!(fs_uuid(&vol.device), intended, "{leftover}");
            call(&agent, &c, Op::Unstage).await.unwrap();
        }
    }
}

/// NodeExpandVolume killed at each of its step boundaries (xfs: it grows online here; ext4's
/// online grow needs CAP_SYS_RESOURCE, which this host cannot grant).
#[tokio::test]
async fn crash_matrix_expand_xfs() {
    if !require_root("crash_matrix_expand_xfs") {
        return;
    }
    for point in [
        "expand.refresh_size.intent",
        "expand.refresh_size.done",
        "expand.grow.intent",
        "expand.grow.done",
        "expand.expanded.done",
    ] {
        let scratch = Scratch::new(&format!("crash-expand-{}", point.replace('.', "-")));
        let mut agent = Agent::start(&scratch, crash_opts(None)).await;
        let vol = create_attached(&agent, "exp", 320 << 20).await;
        let c = Cycle::new(&agent, vol.clone(), "e", "xfs");
        call(&agent, &c, Op::Stage).await.unwrap();
        call(&agent, &c, Op::Publish).await.unwrap();
        std::fs::write(c.target.join("before-crash"), b"survives").unwrap();
        let uuid = fs_uuid(&vol.device);
        let to: i64 = 512 << 20;
        agent
            .controller()
            .await
            .controller_expand_volume(csi::ControllerExpandVolumeRequest {
                volume_id: vol.id.clone(),
                capacity_range: Some(csi::CapacityRange {
                    required_bytes: to,
                    limit_bytes: 0,
                }),
                ..Default::default()
            })
            .await
            .unwrap();
        let expand = csi::NodeExpandVolumeRequest {
            volume_id: vol.id.clone(),
            volume_path: c.target.display().to_string(),
            staging_target_path: c.staging.display().to_string(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: to,
                limit_bytes: 0,
            }),
            volume_capability: Some(c.cap.clone()),
            ..Default::default()
        };
        agent.restart(Some(crash_opts(Some(point)))).await;
        let r = agent.node().await.node_expand_volume(expand.clone()).await;
        assert!(
            agent.wait_exit(Duration::from_secs(20)).await.is_some(),
            "{point}: no crash ({r:?})"
        );
        agent.restart(Some(crash_opts(None))).await;
        for _ in 0..2 {
            let r = agent
                .node()
                .await
                .node_expand_volume(expand.clone())
                .await
                .unwrap_or_else(|e| panic!("{point}: retry failed: {e:?}\n{}", agent.log_text()))
                .into_inner();
            assert_eq!(r.capacity_bytes, to, "{point}");
        }
        let st = nix::sys::statvfs::statvfs(&c.target).unwrap();
        assert!(
            st.blocks() as u64 * st.fragment_size() as u64 > 400 << 20,
            "{point}: not grown"
        );
        assert_eq!(
            std::fs::read(c.target.join("before-crash")).unwrap(),
            b"survives"
        );
        assert_eq!(fs_uuid(&vol.device), uuid, "{point}");
        assert_eq!(mount_count(&c.staging), 1, "{point}");
        assert_eq!(mount_count(&c.target), 1, "{point}");
        call(&agent, &c, Op::Unpublish).await.unwrap();
        call(&agent, &c, Op::Unstage).await.unwrap();
        eprintln!("{point}: recovered");
    }
}
