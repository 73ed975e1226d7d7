//! What the agent must refuse: devices that are not provably blank (never formatted, bytes
//! unchanged) and bad input (INVALID_ARGUMENT or the code the spec names, host unchanged).

use std::collections::HashMap;

use ebs_tests::csi_req::*;
use ebs_tests::*;

use csi::volume_capability::access_mode::Mode;
use tonic::Code;

/// Seeds a device, asks to stage it, and checks the refusal left every byte in place.
async fn refuse_seeded(agent: &Agent, name: &str, requested_fs: &str, seed: &str, size: u64) {
    let vol = create_attached(agent, name, size as i64).await;
    sh(&seed.replace("DEV", &vol.device));
    sh("sync");
    let before = checksum(std::path::Path::new(&vol.device));
    let staging = agent.work.join(format!("staging/{name}"));
    let e = agent
        .node()
        .await
        .node_stage_volume(stage_req(
            &vol,
            &staging,
            mount_cap(requested_fs, Mode::SingleNodeWriter),
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{name}: {e:?}");
    assert!(
        mounts_below(&agent.work.join("staging")).is_empty(),
        "{name}: nothing mounted"
    );
    let after = checksum(std::path::Path::new(&vol.device));
    assert_eq!(
        before,
        after,
        "{name}: device bytes changed: {}",
        e.message()
    );
    eprintln!("{name}: refused with: {}", e.message());
}

const AWAY: u64 = 600 << 20;

/// splitmix64: a fixed seed gives the same offset on every run.
fn splitmix(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[tokio::test]
async fn never_format_matrix() {
    if !require_root("never_format_matrix") {
        return;
    }
    let scratch = Scratch::new("never-format");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let keyfile = scratch.join("luks.key");
    std::fs::write(&keyfile, b"correct horse battery staple").unwrap();
    let cases: Vec<(&str, &str, String)> = vec![
        ("ext4-as-xfs", "xfs", "mkfs.ext4 -q -F DEV".into()),
        ("xfs-as-ext4", "ext4", "mkfs.xfs -q -f DEV".into()),
        ("gpt", "ext4", "sgdisk -o DEV >/dev/null".into()),
        ("mbr", "ext4", "echo 'label: dos\n,10M,L' | sfdisk -q DEV".into()),
        ("lvm", "ext4", "pvcreate -q -ff -y DEV >/dev/null 2>&1 && pvremove -q -ff -y DEV >/dev/null 2>&1; pvcreate -q -y DEV >/dev/null 2>&1 && vgs >/dev/null 2>&1; true".into()),
        (
            "luks",
            "ext4",
            format!(
                "cryptsetup luksFormat -q --batch-mode --type luks2 --pbkdf pbkdf2 --pbkdf-force-iterations 1000 DEV {}",
                keyfile.display()
            ),
        ),
        ("swap", "ext4", "mkswap -q DEV >/dev/null".into()),
        (
            "corrupt-ext4",
            "ext4",
            // Destroy the primary superblock's magic: libblkid then sees nothing at all.
            "mkfs.ext4 -q -F DEV && printf '\\000\\000' | dd of=DEV bs=1 seek=1080 conv=notrunc status=none".into(),
        ),
        (
            "random-data",
            "ext4",
            "head -c 65536 /dev/urandom | dd of=DEV bs=64k seek=4 conv=notrunc status=none".into(),
        ),
    ];
    for (name, fs, seed) in &cases {
        // mkfs.xfs wants at least 300 MB.
        let size = if seed.contains("mkfs.xfs") { 320 } else { 64 };
        refuse_seeded(&agent, name, fs, seed, size << 20).await;
    }
    // Data away from the ends, nothing else (a raw-block volume staged later as a filesystem):
    // 4 MiB in the middle of 600 MiB, far from every signature region, and one 4 KiB block at
    // an offset drawn with a fixed seed. Each must be refused with every byte unchanged.
    let block = 4096 * (1 + splitmix(31) % ((AWAY >> 12) - 2));
    let away: Vec<(&str, &str, String)> = vec![
        (
            "middle-4mib",
            "ext4",
            "head -c 4194304 /dev/urandom | dd of=DEV bs=1M seek=300 conv=notrunc status=none"
                .into(),
        ),
        (
            "middle-4mib-xfs",
            "xfs",
            "head -c 4194304 /dev/urandom | dd of=DEV bs=1M seek=300 conv=notrunc status=none"
                .into(),
        ),
        (
            "one-block",
            "ext4",
            format!(
                "head -c 4096 /dev/urandom | dd of=DEV bs=4096 seek={} conv=notrunc status=none",
                block / 4096
            ),
        ),
    ];
    for (name, fs, seed) in &away {
        refuse_seeded(&agent, name, fs, seed, AWAY).await;
    }
    // LVM leaves device-mapper state only when a VG is activated; make sure none is.
    let _ = std::process::Command::new("pvscan").arg("--cache").output();
}

#[tokio::test]
async fn read_only_capability_on_blank_device_is_refused() {
    if !require_root("read_only_capability_on_blank_device_is_refused") {
        return;
    }
    let scratch = Scratch::new("ro-blank");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let vol = create_attached(&agent, "ro", 64 << 20).await;
    let staging = agent.work.join("staging/ro");
    let e = agent
        .node()
        .await
        .node_stage_volume(stage_req(
            &vol,
            &staging,
            mount_cap("ext4", Mode::SingleNodeReaderOnly),
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert_eq!(fs_uuid(&vol.device), "");
}

/// mkfs.xfs (xfsprogs 5.19+) makes nothing under 300 MiB. A stage that asks for xfs on a smaller
/// device is refused before anything is journaled or run: OUT_OF_RANGE naming the limit, the
/// device still blank, no format record (the journal never saw a format intent), nothing
/// mounted. CreateVolume refuses such a volume up front when its capability asks for xfs.
#[tokio::test]
async fn xfs_below_its_minimum_is_refused_up_front() {
    if !require_root("xfs_below_its_minimum_is_refused_up_front") {
        return;
    }
    let scratch = Scratch::new("xfs-min");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let vol = create_attached(&agent, "small", 64 << 20).await;
    let before = checksum(std::path::Path::new(&vol.device));
    let staging = agent.work.join("staging/small");
    let e = agent
        .node()
        .await
        .node_stage_volume(stage_req(
            &vol,
            &staging,
            mount_cap("xfs", Mode::SingleNodeWriter),
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::OutOfRange, "{e:?}");
    assert!(
        e.message().contains("at least 300 MiB") && e.message().contains("64 MiB"),
        "the limit and the size are named: {}",
        e.message()
    );
    assert_eq!(before, checksum(std::path::Path::new(&vol.device)));
    assert_eq!(fs_uuid(&vol.device), "");
    assert!(mounts_below(&agent.work).is_empty());
    let status = agent.status_json();
    let known = status["volumes"].as_array().unwrap();
    assert!(
        known
            .iter()
            .all(|v| v["filesystem"].is_null() && v["last_step"]["step"] != "format"),
        "no format intent was journaled: {status}"
    );

    // The controller refuses the same size when the capability asks for xfs.
    let e = agent
        .controller()
        .await
        .create_volume(csi::CreateVolumeRequest {
            name: "small-xfs".into(),
            capacity_range: at_least(64 << 20),
            volume_capabilities: vec![mount_cap("xfs", Mode::SingleNodeWriter)],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::OutOfRange, "{e:?}");
    assert!(e.message().contains("300 MiB"), "{}", e.message());
}

#[tokio::test]
async fn bad_input_matrix() {
    if !require_root("bad_input_matrix") {
        return;
    }
    let scratch = Scratch::new("bad-input");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let vol = create_attached(&agent, "bad", 64 << 20).await;
    let base = agent.work.join("staging");
    std::fs::create_dir_all(&base).unwrap();
    let elsewhere = scratch.join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, base.join("link")).unwrap();
    let good = base.join("good");
    let ok_cap = mount_cap("ext4", Mode::SingleNodeWriter);
    let mut node = agent.node().await;

    let mut reqs: Vec<(&str, csi::NodeStageVolumeRequest, Code)> = Vec::new();
    let mut push = |name, f: &dyn Fn(&mut csi::NodeStageVolumeRequest), code| {
        let mut r = stage_req(&vol, &good, ok_cap.clone());
        f(&mut r);
        reqs.push((name, r, code));
    };
    push(
        "relative path",
        &|r| r.staging_target_path = "staging/x".into(),
        Code::InvalidArgument,
    );
    push(
        "dotdot",
        &|r| r.staging_target_path = format!("{}/../../etc", base.display()),
        Code::InvalidArgument,
    );
    push(
        "symlink",
        &|r| r.staging_target_path = format!("{}/link/x", base.display()),
        Code::InvalidArgument,
    );
    push(
        "outside prefixes",
        &|r| r.staging_target_path = "/etc/ebs-evil".into(),
        Code::InvalidArgument,
    );
    push(
        "empty path",
        &|r| r.staging_target_path = String::new(),
        Code::InvalidArgument,
    );
    push(
        "empty volume id",
        &|r| r.volume_id = String::new(),
        Code::InvalidArgument,
    );
    push(
        "oversized volume id",
        &|r| r.volume_id = "v".repeat(200),
        Code::InvalidArgument,
    );
    push(
        "slash in volume id",
        &|r| r.volume_id = "a/b".into(),
        Code::InvalidArgument,
    );
    push(
        "oversized path",
        &|r| r.staging_target_path = format!("{}/{}", base.display(), "p".repeat(5000)),
        Code::InvalidArgument,
    );
    push(
        "oversized context",
        &|r| {
            r.volume_context = HashMap::from([("k".into(), "v".repeat(5000))]);
        },
        Code::InvalidArgument,
    );
    push(
        "missing capability",
        &|r| r.volume_capability = None,
        Code::InvalidArgument,
    );
    push(
        "comma in mount flag",
        &|r| {
            r.volume_capability = Some(mount_cap_flags(
                "ext4",
                Mode::SingleNodeWriter,
                &["noatime,bind"],
            ))
        },
        Code::InvalidArgument,
    );
    push(
        "dangerous mount flag",
        &|r| {
            r.volume_capability = Some(mount_cap_flags(
                "ext4",
                Mode::SingleNodeWriter,
                &["remount"],
            ))
        },
        Code::InvalidArgument,
    );
    push(
        "oversized mount flags",
        &|r| {
            r.volume_capability = Some(mount_cap_flags(
                "ext4",
                Mode::SingleNodeWriter,
                &[&"noatime ".repeat(700)],
            ))
        },
        Code::InvalidArgument,
    );
    push(
        "unknown fs type",
        &|r| r.volume_capability = Some(mount_cap("zfs", Mode::SingleNodeWriter)),
        Code::InvalidArgument,
    );
    push(
        "shell in format option",
        &|r| {
            r.volume_context = HashMap::from([("blockSize".into(), "4096; rm -rf /".into())]);
        },
        Code::InvalidArgument,
    );
    push(
        "option for another fs",
        &|r| {
            r.volume_capability = Some(mount_cap("xfs", Mode::SingleNodeWriter));
            r.volume_context = HashMap::from([("bytesPerInode".into(), "4096".into())]);
        },
        Code::InvalidArgument,
    );
    push(
        "unknown access mode",
        &|r| r.volume_capability = Some(mount_cap("ext4", Mode::Unknown)),
        Code::InvalidArgument,
    );
    push(
        "multi-node writer on a filesystem",
        &|r| r.volume_capability = Some(mount_cap("ext4", Mode::MultiNodeMultiWriter)),
        Code::FailedPrecondition,
    );
    push(
        "unknown volume",
        &|r| r.volume_id = "lv-doesnotexist".into(),
        Code::NotFound,
    );

    for (name, req, code) in reqs {
        let e = node.node_stage_volume(req).await.unwrap_err();
        assert_eq!(e.code(), code, "{name}: {e:?}");
        assert!(!e.message().is_empty());
    }
    assert!(mounts_below(&scratch.path).is_empty(), "nothing mounted");
    assert!(
        std::fs::read_dir(&elsewhere).unwrap().next().is_none(),
        "nothing created through the symlink"
    );
    assert_eq!(fs_uuid(&vol.device), "", "nothing formatted");

    // Publish and unpublish validate their paths the same way.
    let mut p = publish_req(&vol, &good, &base.join("link/t"), ok_cap.clone(), false);
    assert_eq!(
        node.node_publish_volume(p.clone())
            .await
            .unwrap_err()
            .code(),
        Code::InvalidArgument
    );
    p.target_path = "/root/evil".into();
    assert_eq!(
        node.node_publish_volume(p.clone())
            .await
            .unwrap_err()
            .code(),
        Code::InvalidArgument
    );
    p.target_path = format!("{}/t", base.display());
    p.staging_target_path = String::new();
    assert_eq!(
        node.node_publish_volume(p).await.unwrap_err().code(),
        Code::FailedPrecondition
    );
    let u = unpublish_req(&vol, std::path::Path::new("/etc"));
    assert_eq!(
        node.node_unpublish_volume(u).await.unwrap_err().code(),
        Code::InvalidArgument
    );
}
