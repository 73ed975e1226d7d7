//! The checks, in the order an operator fixes things: privileges, tools, kernel, devices,
//! directories, the kubelet mount, instance metadata.

use std::path::Path;

use caps::{CapSet, Capability};

use super::host_paths::{kubelet_propagation, writable_dir};
use super::{Check, DoctorArgs};
use crate::settings::BackendKind;
use ebs_node_core::request::FsType;
use ebs_node_host::fstools::FsTools;

pub async fn all(args: &DoctorArgs) -> Vec<Check> {
    let node = args.mode.serves_node();
    let loop_backend = args.backend == BackendKind::Loop;
    let mut checks = vec![
        capability(
            Capability::CAP_SYS_ADMIN,
            "CAP_SYS_ADMIN",
            node,
            "mount(2), loop devices and the filesystem tools need it",
            "run the agent as root (systemd: keep CAP_SYS_ADMIN in CapabilityBoundingSet; a \
             container: privileged)",
        ),
        capability(
            Capability::CAP_SYS_RESOURCE,
            "CAP_SYS_RESOURCE",
            false,
            "a mounted ext4 cannot grow online (NodeExpandVolume on a staged ext4 volume fails; \
             offline growth at the next stage still works)",
            "grant CAP_SYS_RESOURCE (systemd: CapabilityBoundingSet; a container: privileged)",
        ),
        capability(
            Capability::CAP_MKNOD,
            "CAP_MKNOD",
            false,
            "a loop device whose /dev node is missing (a container without devtmpfs) cannot be \
             created",
            "grant CAP_MKNOD, or mount the host's /dev",
        ),
    ];
    checks.extend(tools(node));
    checks.push(loop_control(loop_backend));
    checks.push(super::syscalls::openat2());
    checks.push(statx_mount_id());
    checks.push(super::syscalls::statmount());
    checks.push(super::syscalls::seccomp());
    checks.push(udev(args.backend));
    if let Some(socket_dir) = args.endpoint.path().parent() {
        checks.push(writable_dir("socket directory", socket_dir, true));
    }
    checks.push(writable_dir("state directory", &args.state_dir, true));
    checks.push(kubelet_propagation(&args.kubelet_dir));
    checks.push(imds(args).await);
    checks
}

fn capability(
    cap: Capability,
    name: &'static str,
    needed: bool,
    without: &str,
    fix: &str,
) -> Check {
    match caps::has_cap(None, CapSet::Effective, cap) {
        Ok(true) => Check::ok(name, "in the effective set"),
        Ok(false) if !caps::has_cap(None, CapSet::Bounding, cap).unwrap_or(true) => Check::lacking(
            name,
            needed,
            format!("missing, and not in this host's bounding set either: {without}"),
            format!("{fix}; this host (or its container runtime) must allow it first"),
        ),
        Ok(false) => Check::lacking(name, needed, format!("missing: {without}"), fix),
        Err(e) => Check::lacking(name, needed, format!("cannot read capabilities: {e}"), fix),
    }
}

fn tools(node: bool) -> Vec<Check> {
    let found = FsTools::detect();
    let mut out = Vec::new();
    for (fs, name, needed) in [
        (FsType::Ext4, "ext4 tools", node),
        (FsType::Xfs, "xfs tools", false),
    ] {
        out.push(match found.supports(fs) {
            Ok(()) if fs == FsType::Ext4 => Check::ok(name, "mkfs.ext4, e2fsck, resize2fs"),
            Ok(()) => Check::ok(name, "mkfs.xfs, xfs_growfs"),
            Err(why) => Check::lacking(
                name,
                needed,
                if needed {
                    format!("{why}: volumes cannot be formatted, checked or grown")
                } else {
                    format!("{why}: {fs} volumes will be refused")
                },
                format!(
                    "apt-get install {} (or your distribution's package)",
                    if fs.is_ext() { "e2fsprogs" } else { "xfsprogs" }
                ),
            ),
        });
    }
    out
}

fn loop_control(loop_backend: bool) -> Check {
    const NAME: &str = "loop devices";
    if !loop_backend {
        return Check::skipped(NAME, "only the loop backend attaches loop devices");
    }
    if Path::new("/dev/loop-control").exists() {
        Check::ok(NAME, "/dev/loop-control is there")
    } else {
        Check::lacking(
            NAME,
            true,
            "/dev/loop-control is missing",
            "modprobe loop (in a container: mknod -m 0660 /dev/loop-control c 10 237, or mount \
             the host's /dev)",
        )
    }
}

fn statx_mount_id() -> Check {
    use rustix::fs::{AtFlags, CWD, StatxFlags, statx};
    const NAME: &str = "statx mount ids";
    match statx(CWD, "/", AtFlags::empty(), StatxFlags::MNT_ID) {
        Ok(s) if s.stx_mask & StatxFlags::MNT_ID.bits() != 0 => Check::ok(
            NAME,
            "STATX_MNT_ID answers (mount lookups need no mount-table read)",
        ),
        Ok(_) | Err(_) => Check::lacking(
            NAME,
            false,
            "STATX_MNT_ID unavailable: mount lookups read /proc/self/mountinfo (slower on nodes \
             with many mounts)",
            "run a kernel of 5.8 or later",
        ),
    }
}

fn udev(backend: BackendKind) -> Check {
    const NAME: &str = "udev";
    if backend != BackendKind::Ebs {
        return Check::skipped(NAME, "only the ebs backend waits for device events");
    }
    if Path::new("/run/udev/control").exists() {
        Check::ok(NAME, "udevd runs (/run/udev/control)")
    } else {
        Check::lacking(
            NAME,
            false,
            "udevd is not running here: newly attached volumes are found by rescanning sysfs, \
             not announced",
            "run systemd-udevd on the host; in a container mount the host's /run/udev read-only",
        )
    }
}

async fn imds(args: &DoctorArgs) -> Check {
    const NAME: &str = "instance metadata";
    if args.backend != BackendKind::Ebs {
        return Check::skipped(NAME, "only the ebs backend asks IMDS");
    }
    if args.skip_imds {
        return Check::skipped(NAME, "--skip-imds");
    }
    let client = match ebs_node_backends::nodeinfo::imds::ImdsClient::new(
        &args.imds_endpoint,
        args.imds_timeout,
    ) {
        Ok(mut c) => {
            c.attempts = 1;
            c
        }
        Err(e) => return Check::lacking(NAME, false, e.to_string(), "fix --imds-endpoint"),
    };
    match tokio::time::timeout(args.imds_timeout * 3, client.identity()).await {
        Ok(Ok(id)) => Check::ok(
            NAME,
            format!(
                "{} answered (instance {}); the hop limit lets replies through",
                args.imds_endpoint, id.instance_id
            ),
        ),
        Ok(Err(e)) => Check::lacking(
            NAME,
            false,
            format!("{}: {e}", args.imds_endpoint),
            "in a container use host networking or set the instance's \
             HttpPutResponseHopLimit to 2; elsewhere give --zone/--instance-type/--node-id or \
             --imds-disabled; --skip-imds skips this check",
        ),
        Err(_) => Check::lacking(
            NAME,
            false,
            format!(
                "{} did not answer within {} ms",
                args.imds_endpoint,
                (args.imds_timeout * 3).as_millis()
            ),
            "in a container use host networking or set the instance's \
             HttpPutResponseHopLimit to 2; off EC2 pass --skip-imds",
        ),
    }
}
