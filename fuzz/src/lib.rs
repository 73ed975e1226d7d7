//! The fuzz targets' oracles: one function per parser of outside input, taking raw bytes. Each
//! parses, then checks what the parser promises of anything it accepts, so a fuzzer finds wrong
//! answers as well as panics.
//!
//! The parsers live in the core and host crates (and the store, for the state targets), never
//! in the daemon: a fuzz build compiles neither tonic nor tokio's server, and nothing here is
//! linked into the agent.

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};

use ebs_node_core::ec2::{self, attach_limit, ebs, imds};
use ebs_node_core::request::{FormatOptions, FsType, MountFlags, RequestPath, VolumeId};

/// Splits fuzz input at newlines into UTF-8 strings (invalid bytes replaced, as a gRPC layer
/// never hands the parsers anything but UTF-8).
fn lines(data: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(data)
        .split('\n')
        .map(str::to_string)
        .collect()
}

/// The filesystem a request names, chosen by the input's first byte.
fn fs_of(data: &[u8]) -> (FsType, &[u8]) {
    match data.split_first() {
        Some((b, rest)) => (FsType::ALL[usize::from(*b) % FsType::ALL.len()], rest),
        None => (FsType::Ext4, data),
    }
}

pub fn volume_id(data: &[u8]) {
    let Ok(raw) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(id) = VolumeId::parse(raw) {
        assert_eq!(id.as_str(), raw);
        assert!(!raw.is_empty() && raw.len() <= ebs_node_core::request::MAX_STRING_BYTES);
        match id.local_device() {
            // A node-local handle names a device below /dev, by plain components only.
            Some(dev) => {
                assert!(dev.starts_with("/dev/"));
                assert!(
                    dev.components()
                        .skip(1)
                        .all(|c| matches!(c, std::path::Component::Normal(_)))
                );
            }
            None => assert!(!raw.contains('/')),
        }
        // What paths and journal keys are made of: one component, never `.` or `..`.
        if let Some(name) = id.file_name() {
            assert!(!name.is_empty() && !name.contains('/') && name != "." && name != "..");
        }
        // The ebs backend's serial for it is derived, never parsed loosely.
        if let Some(serial) = ebs::serial_of(&id) {
            assert!(serial.starts_with("vol") && !serial.contains('-'));
        }
    }
}

/// A staging or target path against nested prefixes and the agent's own directories (one of them
/// holding a carved-out prefix, as v0.1's staging directory sits in the state directory).
pub fn request_path(data: &[u8]) {
    let Ok(raw) = std::str::from_utf8(data) else {
        return;
    };
    let roots = ebs_node_core::request::Roots::new(
        vec![
            PathBuf::from("/var/lib/kubelet"),
            PathBuf::from("/var/lib/kubelet/plugins"),
            PathBuf::from("/var/lib/ebs-node-agent/v01-staging"),
        ],
        vec![
            PathBuf::from("/var/lib/ebs-node-agent"),
            PathBuf::from("/var/lib/kubelet/plugins/ebs.csi.aws.com"),
        ],
    );
    if let Ok(path) = RequestPath::parse("target_path", raw, &roots) {
        let p: &Path = path.as_path();
        assert!(p.is_absolute(), "{p:?}");
        // Strictly below a prefix, never a prefix or above one.
        assert!(
            roots.allowed.iter().any(|a| p.starts_with(a) && p != a),
            "{p:?}"
        );
        assert!(!roots.allowed.iter().any(|a| a.starts_with(p)), "{p:?}");
        assert!(
            !p.starts_with("/var/lib/kubelet/plugins/ebs.csi.aws.com"),
            "{p:?} is in the socket directory"
        );
        assert!(
            !p.starts_with("/var/lib/ebs-node-agent")
                || p.starts_with("/var/lib/ebs-node-agent/v01-staging"),
            "{p:?} is in the state directory"
        );
        assert!(
            p.components()
                .all(|c| matches!(c, Component::RootDir | Component::Normal(_))),
            "{p:?} keeps a . or .. component"
        );
        assert!(p.as_os_str().len() <= ebs_node_core::request::MAX_PATH_BYTES);
    }
}

/// Mount flags, one per line; the first byte picks the filesystem.
pub fn mount_flags(data: &[u8]) {
    let (fs, rest) = fs_of(data);
    let items = lines(rest);
    if let Ok(flags) = MountFlags::parse(fs, &items) {
        assert_eq!(flags.raw(), items.as_slice());
        for item in flags.data() {
            assert!(
                plain_option(item) || selinux_option(item),
                "{item:?} reaches mount(2)"
            );
        }
        let _ = flags.wants_read_only();
    }
}

/// An option of letters, digits and `=_-.` only: nothing that could end it or start another.
fn plain_option(item: &str) -> bool {
    item.bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"=_-.".contains(&b))
}

/// An SELinux option as it reaches mount(2): `key="context"`, the context in double quotes (the
/// kernel keeps a quoted value together, commas included) and made of what a context may hold.
fn selinux_option(item: &str) -> bool {
    let Some((key, quoted)) = item.split_once('=') else {
        return false;
    };
    let context = quoted.strip_prefix('"').and_then(|q| q.strip_suffix('"'));
    ["context", "fscontext", "defcontext", "rootcontext"].contains(&key)
        && context.is_some_and(|c| {
            !c.is_empty()
                && c.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_.-:,".contains(&b))
        })
}

/// Format options as `key=value` lines of a volume context; the first byte picks the filesystem.
pub fn format_options(data: &[u8]) {
    let (fs, rest) = fs_of(data);
    let ctx: HashMap<String, String> = lines(rest)
        .into_iter()
        .map(|l| match l.split_once('=') {
            Some((k, v)) => (k.to_string(), v.to_string()),
            None => (l, String::new()),
        })
        .collect();
    if let Ok(options) = FormatOptions::parse(fs, &ctx) {
        for arg in options.mkfs_args(fs) {
            assert!(
                arg.starts_with('-') || arg.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'='),
                "{arg:?} reaches mkfs"
            );
        }
    }
}

pub fn grpc_timeout(data: &[u8]) {
    let Ok(raw) = std::str::from_utf8(data) else {
        return;
    };
    if ebs_node_core::deadline::parse_grpc_timeout(raw).is_some() {
        assert!(raw.len() >= 2 && raw.len() <= 9, "{raw:?}");
    }
}

pub fn mountinfo(data: &[u8]) {
    if let Ok(table) = ebs_node_host::mount::table::MountTable::parse_bytes(data) {
        for entry in table.entries() {
            let _ = entry.is_read_only();
            let _ = entry.super_read_only();
            assert!(table.at(&entry.mount_point).is_some());
            let _ = table.mounts_of_device(entry.major, entry.minor).count();
        }
    }
}

/// What sysfs says of a disk: identify strings (serial, model, padded with spaces or NULs),
/// `dev` numbers, disk names, and the `partition` volume-context key.
pub fn sysfs_strings(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    if let Some(clean) = ebs::clean(&text) {
        assert!(!clean.is_empty() && clean.trim() == clean);
    }
    let _ = ebs_node_core::DevNum::parse(&text);
    let _ = ebs::is_multipath_path_name(&text);
    let normalized = ebs::normalize_serial(&text);
    assert!(!normalized.contains('-'));
    let _ = ec2::is_instance_id(&text);
    let ctx = HashMap::from([("partition".to_string(), text.into_owned())]);
    if let Ok(Some(n)) = ebs::partition_of(&ctx) {
        assert!((1..=128).contains(&n));
    }
}

/// An instance-metadata answer (HTTP/1.1 head and body, maybe chunked), then what the agent
/// makes of a body: an instance type looked up in the attach-limit table, an instance id.
pub fn imds_response(data: &[u8]) {
    if let Ok(answer) = imds::parse_response(data) {
        assert!(answer.body.len() <= imds::MAX_RESPONSE);
        let value = answer.body.trim();
        let _ = attach_limit::lookup(value);
        let _ = ec2::is_instance_id(value);
        let _ = ec2::is_instance_type(value);
    }
}

/// Every committed seed of these targets (`fuzz/seeds/TARGET`, crashes found once included)
/// through its oracle, without libFuzzer: `cargo test --lib` in `fuzz/`. The suite's own check is
/// `fuzz/run.sh`, whose libFuzzer executes every seed before it mutates any, so a seed that fails
/// its oracle fails the run at once, not by chance.
#[cfg(test)]
mod seeds {
    type Target = fn(&[u8]);

    #[test]
    fn every_committed_seed_passes_its_target() {
        let targets: &[(&str, Target)] = &[
            ("volume_id", super::volume_id),
            ("request_path", super::request_path),
            ("mount_flags", super::mount_flags),
            ("format_options", super::format_options),
            ("grpc_timeout", super::grpc_timeout),
            ("mountinfo", super::mountinfo),
            ("sysfs_strings", super::sysfs_strings),
            ("imds_response", super::imds_response),
        ];
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds");
        let mut ran = 0;
        for (name, target) in targets {
            let dir = root.join(name);
            let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{dir:?}: {e}"));
            for entry in entries.flatten() {
                let data = std::fs::read(entry.path()).expect("a seed");
                target(&data);
                ran += 1;
            }
        }
        assert!(ran > 8, "only {ran} seeds");
    }
}
