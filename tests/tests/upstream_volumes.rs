//! Volumes as the upstream EBS controller and kubelet describe them, staged on real loop
//! devices: format parameters under both spellings of their keys (read back from the
//! filesystem), `--legacy-xfs`, a user's `nouuid`, and kubelet's SELinux context option.

use std::collections::HashMap;
use std::path::Path;

use ebs_tests::csi_req::*;
use ebs_tests::*;

use csi::volume_capability::access_mode::Mode;
use tonic::Code;

const SELINUX_CONTEXT: &str = "context=\"system_u:object_r:container_file_t:s0:c1,c2\"";

fn context(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// `Key: value` lines of a tool's output (dumpe2fs -h).
fn field(text: &str, key: &str) -> String {
    text.lines()
        .find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix(':')))
        .unwrap_or_else(|| panic!("no {key} in\n{text}"))
        .trim()
        .to_string()
}

fn dumpe2fs(device: &str) -> String {
    let out = sh(&format!("dumpe2fs -h {device} 2>/dev/null"));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn xfs_info(device: &str) -> String {
    let out = sh(&format!("xfs_info {device}"));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Whether the installed mkfs.xfs is older than `major.minor`.
fn xfsprogs_older_than(major: u32, minor: u32) -> bool {
    let out = sh("mkfs.xfs -V");
    let text = String::from_utf8_lossy(&out.stdout);
    let version: Vec<u32> = text
        .rsplit(' ')
        .next()
        .unwrap_or("")
        .trim()
        .split('.')
        .filter_map(|n| n.parse().ok())
        .collect();
    version.len() >= 2 && (version[0], version[1]) < (major, minor)
}

fn mount_line(staging: &Path) -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    info.lines()
        .find(|l| l.split(' ').nth(4) == staging.to_str())
        .map(str::to_string)
}

/// Stages a new volume with `ctx` as its volume context; returns its device.
async fn stage_with(
    agent: &Agent,
    name: &str,
    fs: &str,
    flags: &[&str],
    ctx: &[(&str, &str)],
) -> (Vol, std::path::PathBuf) {
    let size = if fs == "xfs" { 320 << 20 } else { 128 << 20 };
    let vol = create_attached(agent, name, size).await;
    let staging = agent.work.join(format!("staging/{name}"));
    let mut req = stage_req(
        &vol,
        &staging,
        mount_cap_flags(fs, Mode::SingleNodeWriter, flags),
    );
    req.volume_context = context(ctx);
    agent
        .node()
        .await
        .node_stage_volume(req)
        .await
        .unwrap_or_else(|e| panic!("stage {name}: {e}\n{}", agent.log_text()));
    (vol, staging)
}

#[tokio::test]
async fn ext4_format_keys_in_lowercase_and_camel_case_reach_mkfs() {
    if !require_root("ext4_format_keys_in_lowercase_and_camel_case_reach_mkfs") {
        return;
    }
    let scratch = Scratch::new("upstream-ext4-keys");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    // What the upstream controller writes into the volume context: lowercase keys.
    let (lower, _) = stage_with(
        &agent,
        "lower",
        "ext4",
        &[],
        &[
            ("blocksize", "4096"),
            ("inodesize", "512"),
            ("numberofinodes", "5000"),
            ("ext4encryptionsupport", "true"),
        ],
    )
    .await;
    let text = dumpe2fs(&lower.device);
    // mke2fs would pick 1024 for a volume this small.
    assert_eq!(field(&text, "Block size"), "4096", "{text}");
    assert_eq!(field(&text, "Inode size"), "512");
    let inodes: u64 = field(&text, "Inode count").parse().unwrap();
    assert!((4900..5300).contains(&inodes), "{inodes}");
    assert!(field(&text, "Filesystem features").contains("encrypt"));

    // A StorageClass or static volume in camelCase.
    let (camel, _) = stage_with(
        &agent,
        "camel",
        "ext4",
        &[],
        &[
            ("blockSize", "2048"),
            ("bytesPerInode", "65536"),
            ("ext4BigAlloc", "true"),
            ("ext4ClusterSize", "16384"),
        ],
    )
    .await;
    let text = dumpe2fs(&camel.device);
    assert_eq!(field(&text, "Block size"), "2048", "{text}");
    assert_eq!(field(&text, "Cluster size"), "16384");
    assert!(field(&text, "Filesystem features").contains("bigalloc"));
    let inodes: u64 = field(&text, "Inode count").parse().unwrap();
    assert!(inodes <= (128 << 20) / 65536 + 64, "{inodes}");
}

#[tokio::test]
async fn xfs_format_keys_in_both_spellings_and_a_users_nouuid() {
    if !require_root("xfs_format_keys_in_both_spellings_and_a_users_nouuid") {
        return;
    }
    let scratch = Scratch::new("upstream-xfs-keys");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let (lower, lower_staging) = stage_with(
        &agent,
        "lower",
        "xfs",
        &["nouuid"],
        &[("blocksize", "2048"), ("inodesize", "1024")],
    )
    .await;
    let text = xfs_info(&lower.device);
    assert!(text.contains("bsize=2048"), "{text}");
    assert!(text.contains("isize=1024"), "{text}");
    // The user's nouuid and the agent's own: one in the mount.
    let line = mount_line(&lower_staging).expect("mounted");
    assert_eq!(line.matches("nouuid").count(), 1, "{line}");

    let (camel, _) = stage_with(
        &agent,
        "camel",
        "xfs",
        &[],
        &[("blockSize", "1024"), ("inodeSize", "512")],
    )
    .await;
    let text = xfs_info(&camel.device);
    assert!(text.contains("bsize=1024"), "{text}");
    assert!(text.contains("isize=512"), "{text}");
    // Without --legacy-xfs, mkfs.xfs's own defaults.
    assert!(!text.contains("bigtime=0"), "{text}");
}

#[tokio::test]
async fn legacy_xfs_formats_for_old_kernels() {
    if !require_root("legacy_xfs_formats_for_old_kernels") {
        return;
    }
    let scratch = Scratch::new("upstream-legacy-xfs");
    let opts = AgentOpts {
        args: vec![
            "--backend".into(),
            "loop".into(),
            "--legacy-xfs=true".into(),
        ],
        ..AgentOpts::default()
    };
    let agent = Agent::start(&scratch, opts).await;
    let (vol, _) = stage_with(&agent, "legacy", "xfs", &[], &[]).await;
    let text = xfs_info(&vol.device);
    for feature in ["bigtime=0", "inobtcount=0", "reflink=0"] {
        assert!(text.contains(feature), "{feature}: {text}");
    }
    // Upstream's `-i nrext64=0` (v1.50, for Amazon Linux 2 kernels), where mkfs.xfs knows it:
    // xfs_info shows the flag only from xfsprogs 5.19 on, the version that added the option.
    if text.contains("nrext64=") {
        assert!(text.contains("nrext64=0"), "{text}");
    } else {
        assert!(xfsprogs_older_than(5, 19), "no nrext64 shown: {text}");
    }
}

#[tokio::test]
async fn kubelets_selinux_option_is_parsed_and_handed_to_mount() {
    if !require_root("kubelets_selinux_option_is_parsed_and_handed_to_mount") {
        return;
    }
    let scratch = Scratch::new("upstream-selinux");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let mut node = agent.node().await;

    // Not a context: refused before anything happens to the volume.
    let vol = create_attached(&agent, "selinux", 128 << 20).await;
    let staging = agent.work.join("staging/selinux");
    for bad in [
        "context=\"system_u:object_r:container_file_t:s0:c1,c2\",bind",
        "context=\"system_u:object_r\"",
        "context=system_u:object_r:t:s0;reboot",
    ] {
        let req = stage_req(
            &vol,
            &staging,
            mount_cap_flags("ext4", Mode::SingleNodeWriter, &[bad]),
        );
        let err = node.node_stage_volume(req).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{bad}: {err}");
        assert!(
            fs_uuid(&vol.device).is_empty(),
            "{bad}: the volume was formatted"
        );
    }

    // A formatted volume, then kubelet's option as it sends it.
    node.node_stage_volume(stage_req(
        &vol,
        &staging,
        mount_cap("ext4", Mode::SingleNodeWriter),
    ))
    .await
    .unwrap();
    let uuid = fs_uuid(&vol.device);
    node.node_unstage_volume(unstage_req(&vol, &staging))
        .await
        .unwrap();
    let req = stage_req(
        &vol,
        &staging,
        mount_cap_flags(
            "ext4",
            Mode::SingleNodeWriter,
            &[SELINUX_CONTEXT, "noatime"],
        ),
    );
    let answer = node.node_stage_volume(req).await;
    if Path::new("/sys/fs/selinux/enforce").exists() {
        // An SELinux host: the kernel takes the context and shows it on the mount.
        answer.unwrap();
        let line = mount_line(&staging).expect("mounted");
        assert!(line.contains("container_file_t:s0:c1,c2"), "{line}");
        node.node_unstage_volume(unstage_req(&vol, &staging))
            .await
            .unwrap();
    } else {
        // No SELinux here: the option reached mount(2), whole, and the kernel's refusal comes
        // back as a clear error; nothing is mounted and the volume is untouched.
        let err = answer.unwrap_err();
        assert_eq!(err.code(), Code::Internal, "{err}");
        assert!(
            err.message().contains(SELINUX_CONTEXT),
            "the options passed: {}",
            err.message()
        );
        assert!(
            err.message().contains("Invalid argument"),
            "the kernel's answer: {}",
            err.message()
        );
        assert_eq!(mount_line(&staging), None);
        assert_eq!(fs_uuid(&vol.device), uuid, "the volume changed");
    }
}
