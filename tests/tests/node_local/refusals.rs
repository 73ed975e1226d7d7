//! Bad node-local handles: the spec's code through every door (v1 and v0.3 stage, v0.1
//! publish), and nothing changes on the host: nothing mounted, no directory left, no byte of a
//! device written.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use ebs_tests::csi_req::*;
use ebs_tests::legacy::*;
use ebs_tests::*;

use csi::volume_capability::access_mode::Mode;
use tonic::Code;
use v0::volume_capability::access_mode::Mode as Mode0;

use super::Disk;

const SIZE: u64 = 64 << 20;

/// Asks every door to stage `handle` and checks each refuses it with `want`, leaving nothing.
async fn refused(agent: &Agent, row: &str, handle: &str, device: Option<&Path>, want: Code) {
    let info: HashMap<String, String> = device
        .map(|d| HashMap::from([("devicePath".to_string(), d.display().to_string())]))
        .unwrap_or_default();
    let before = device.map(checksum);
    let staging = agent.work.join(format!("staging/{row}"));
    let mut r = stage_req(
        &Vol {
            id: handle.into(),
            device: String::new(),
        },
        &staging,
        mount_cap("ext4", Mode::MultiNodeMultiWriter),
    );
    r.publish_context = info.clone();
    let e = agent.node().await.node_stage_volume(r).await.unwrap_err();
    assert_eq!(e.code(), want, "{row}: v1: {e:?}");
    eprintln!("{row}: v1 {:?}: {}", e.code(), e.message());

    let mut s0 = v0_stage(handle, &info, &staging, "ext4");
    s0.volume_capability = Some(v0_mount_cap("ext4", Mode0::MultiNodeMultiWriter));
    let e = v0_node(agent)
        .await
        .node_stage_volume(s0)
        .await
        .unwrap_err();
    assert_eq!(e.code(), want, "{row}: v0.3: {e:?}");

    let target = agent.work.join(format!("pods/{row}/mount"));
    let e = v01_node(agent)
        .await
        .node_publish_volume(v01_publish(handle, &info, &target, "ext4"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), want, "{row}: v0.1: {e:?}");

    assert!(mounts_below(&agent.work).is_empty(), "{row}: mounted");
    assert!(!staging.exists() && !target.exists(), "{row}: a path made");
    let v01 = agent.state_dir.join("v01-staging");
    let left: Vec<PathBuf> = std::fs::read_dir(&v01)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "{row}: v0.1 left {left:?}");
    if let (Some(d), Some(b)) = (device, before) {
        assert_eq!(checksum(d), b, "{row}: the device's bytes changed");
    }
}

fn handle_of(dev: &Path) -> String {
    format!(
        "local-ebs://{}",
        dev.display().to_string().trim_start_matches('/')
    )
}

/// A process in a mount namespace of its own that keeps `dev` mounted: the kernel's claim is
/// all this agent can see of it. Killed by its pid on drop.
///
/// A new mount namespace starts as a copy of every mount there is, the other tests' volumes
/// too (they run in parallel in this process), and with private propagation the copies stay
/// when those tests unmount theirs: their devices would stay claimed while this one sleeps, and
/// their unstage is rightly refused ("still mounted elsewhere"). So the namespace first lets go
/// of every test's mount.
struct ForeignMount(Child);

impl ForeignMount {
    fn start(scratch: &Scratch, dev: &Path) -> ForeignMount {
        let dir = scratch.join("foreign-mnt");
        let ready = scratch.join("foreign-ready");
        std::fs::create_dir_all(&dir).unwrap();
        let child = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c"])
            .arg(format!(
                "awk '{{print $5}}' /proc/self/mountinfo | grep '^{tests}' | sort -r | \
                 while read -r m; do umount -l \"$m\" 2>/dev/null; done; \
                 mount {} {} && touch {} && exec sleep 120",
                dev.display(),
                dir.display(),
                ready.display(),
                tests = std::env::temp_dir().join("ebs-it-").display(),
            ))
            .spawn()
            .expect("unshare");
        let until = Instant::now() + Duration::from_secs(10);
        while !ready.exists() {
            assert!(Instant::now() < until, "the foreign mount never came");
            std::thread::sleep(Duration::from_millis(20));
        }
        ForeignMount(child)
    }
}

impl Drop for ForeignMount {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn bad_node_local_handles_change_nothing() {
    if !require_root("bad_node_local_handles_change_nothing") {
        return;
    }
    let scratch = Scratch::new("node-local-bad");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;

    // Malformed: INVALID_ARGUMENT before anything is looked at.
    for (row, handle) in [
        ("dotdot", "local-ebs://../x"),
        ("dotdot-in-dev", "local-ebs://dev/../etc/passwd"),
        ("outside-dev", "local-ebs://etc/passwd"),
        ("empty-component", "local-ebs://dev//loop0"),
        ("leading-slash", "local-ebs:///dev/loop0"),
        ("no-device", "local-ebs://"),
        ("escaped-form", "local-ebs:dev:loop0"),
    ] {
        refused(&agent, row, handle, None, Code::InvalidArgument).await;
    }

    // No block device there: NOT_FOUND (the volume is not on this node).
    let absent = format!("local-ebs://dev/ebs-it-absent-{}", std::process::id());
    refused(&agent, "absent", &absent, None, Code::NotFound).await;
    refused(
        &agent,
        "char-device",
        "local-ebs://dev/null",
        None,
        Code::NotFound,
    )
    .await;
    if Path::new("/dev/shm").is_dir() {
        refused(
            &agent,
            "directory",
            "local-ebs://dev/shm",
            None,
            Code::NotFound,
        )
        .await;
    }

    // A loop device with no file behind it is attached to nothing: NOT_FOUND (a forty-eighth
    // fresh review's F3: INTERNAL before). One of a number no other test takes, made and
    // removed here.
    let unbound = UnboundLoop::new();
    let handle = format!("local-ebs://dev/loop{}", unbound.0);
    refused(&agent, "unbound-loop", &handle, None, Code::NotFound).await;
    drop(unbound);

    // A disk holding a filesystem mounted elsewhere: FAILED_PRECONDITION, still mounted there.
    let busy = Disk::new(&scratch, "busy", SIZE);
    sh(&format!("mkfs.ext4 -q -F {}", busy.dev.display()));
    let elsewhere = scratch.join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    sh(&format!(
        "mount {} {}",
        busy.dev.display(),
        elsewhere.display()
    ));
    refused(
        &agent,
        "mounted-elsewhere",
        &handle_of(&busy.dev),
        None,
        Code::FailedPrecondition,
    )
    .await;
    assert!(mounts_below(&scratch.path).contains(&elsewhere));
    sh(&format!("umount {}", elsewhere.display()));

    // The same disk mounted in another mount namespace only: the kernel's claim refuses it.
    {
        let alone = crate::NAMESPACE_COPY.write().await;
        let _foreign = ForeignMount::start(&scratch, &busy.dev);
        // The namespace has dropped its copies of other tests' mounts: they may go on.
        drop(alone);
        refused(
            &agent,
            "mounted-in-another-namespace",
            &handle_of(&busy.dev),
            None,
            Code::FailedPrecondition,
        )
        .await;
    }

    // A free partition of a disk whose other partition is mounted (as on a root disk), and the
    // whole disk: FAILED_PRECONDITION, the free partition's bytes unchanged. Loop devices get
    // partitions only where the loop driver scans them (max_part > 0).
    partitions(&agent, &scratch).await;

    // The root disk, where it is a block device this test can name.
    let out = sh("findmnt -no SOURCE /");
    let root = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let is_block = std::fs::metadata(&root)
        .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_block_device(&m.file_type()));
    if root.starts_with("/dev") && is_block {
        refused(
            &agent,
            "root-disk",
            &handle_of(&root),
            None,
            Code::FailedPrecondition,
        )
        .await;
    } else {
        eprintln!("root is {root:?}, not a block device: its row is the partition rows above");
    }
}

async fn partitions(agent: &Agent, scratch: &Scratch) {
    let img = scratch.join("parted.img");
    sh(&format!(
        "truncate -s 96M {0} && printf 'label: gpt\\n,32M\\n,\\n' | sfdisk -q {0}",
        img.display()
    ));
    let out = sh(&format!("losetup --find --show -P {}", img.display()));
    let parted = Disk {
        dev: PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()),
    };
    let p = |n: u32| PathBuf::from(format!("{}p{n}", parted.dev.display()));
    let until = Instant::now() + Duration::from_secs(5);
    while !(p(1).exists() && p(2).exists()) {
        if Instant::now() > until {
            eprintln!(
                "{:?} shows no partitions (the loop driver does not scan them here): the \
                 partition rows are left out, the whole-disk rule is the rows above",
                parted.dev
            );
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    sh(&format!("mkfs.ext4 -q -F {}", p(1).display()));
    let host_fs = scratch.join("host-fs");
    std::fs::create_dir_all(&host_fs).unwrap();
    sh(&format!("mount {} {}", p(1).display(), host_fs.display()));
    refused(
        agent,
        "sibling-partition",
        &handle_of(&p(2)),
        Some(&p(2)),
        Code::FailedPrecondition,
    )
    .await;
    refused(
        agent,
        "whole-disk",
        &handle_of(&parted.dev),
        None,
        Code::FailedPrecondition,
    )
    .await;
    sh(&format!("umount {}", host_fs.display()));
}

/// A loop device with nothing attached, at a number of its own (`LOOP_CTL_ADD`), removed on
/// drop.
struct UnboundLoop(u32);

impl UnboundLoop {
    fn new() -> UnboundLoop {
        let n = 3000 + std::process::id() % 1000;
        sh(&format!(
            "/usr/bin/python3 -c 'import fcntl, os; fd = os.open(\"/dev/loop-control\", os.O_RDWR); \
             fcntl.ioctl(fd, 0x4C80, {n})' && for _ in $(seq 50); do [ -b /dev/loop{n} ] && break; \
             sleep 0.1; done; [ -b /dev/loop{n} ]"
        ));
        UnboundLoop(n)
    }
}

impl Drop for UnboundLoop {
    fn drop(&mut self) {
        let _ = std::process::Command::new("/usr/bin/python3")
            .arg("-c")
            .arg(format!(
                "import fcntl, os; fd = os.open('/dev/loop-control', os.O_RDWR); \
                 fcntl.ioctl(fd, 0x4C81, {})",
                self.0
            ))
            .status();
    }
}
