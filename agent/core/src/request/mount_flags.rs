//! Mount options from the volume capability. Only options known to be harmless are accepted: an
//! option list reaches mount(2) as flags plus a comma-joined data string, so a `,` inside one item,
//! or an option such as `bind` or `remount`, could turn our mount into something else.
//!
//! Kubelet's SELinux options (`context="system_u:object_r:container_file_t:s0:c1,c2"`, sent when
//! the CSIDriver has `seLinuxMount: true`) are the one place a value may hold `:` and `,`: the
//! context is checked against SELinux's grammar and passed quoted, the form the kernel's option
//! parser keeps whole. Whether the kernel accepts it is the kernel's answer (no SELinux: EINVAL).

use super::{FsType, ValidationError};

const FIELD: &str = "volume_capability.mount.mount_flags";
const MAX_TOTAL_BYTES: usize = 4096;
const MAX_ITEM_BYTES: usize = 256;

/// SELinux's mount options; each takes one security context.
const SELINUX_KEYS: &[&str] = &["context", "fscontext", "defcontext", "rootcontext"];

/// mount(2)'s flag bits (Linux's uapi `MS_*`, a stable ABI). The core crate links no libc; the
/// host crate's tests hold these equal to libc's (its lib.rs, `abi`).
pub mod ms {
    pub const RDONLY: u64 = 1;
    pub const NOSUID: u64 = 2;
    pub const NODEV: u64 = 4;
    pub const NOEXEC: u64 = 8;
    pub const SYNCHRONOUS: u64 = 16;
    pub const DIRSYNC: u64 = 128;
    pub const NOATIME: u64 = 1024;
    pub const NODIRATIME: u64 = 2048;
    pub const RELATIME: u64 = 1 << 21;
    pub const STRICTATIME: u64 = 1 << 24;
    pub const LAZYTIME: u64 = 1 << 25;
}

/// Options that are mount(2) flags rather than filesystem data.
const VFS_FLAGS: &[(&str, u64)] = &[
    ("ro", ms::RDONLY),
    ("rw", 0),
    ("noatime", ms::NOATIME),
    ("nodiratime", ms::NODIRATIME),
    ("relatime", ms::RELATIME),
    ("strictatime", ms::STRICTATIME),
    ("lazytime", ms::LAZYTIME),
    ("nodev", ms::NODEV),
    ("nosuid", ms::NOSUID),
    ("noexec", ms::NOEXEC),
    ("sync", ms::SYNCHRONOUS),
    ("dirsync", ms::DIRSYNC),
    ("dev", 0),
    ("suid", 0),
    ("exec", 0),
    ("async", 0),
    ("atime", 0),
    ("defaults", 0),
];

/// Filesystem data options; `=N` marks a numeric value, `=a|b` a fixed choice.
const EXT_DATA: &[&str] = &[
    "acl",
    "noacl",
    "user_xattr",
    "nouser_xattr",
    "discard",
    "nodiscard",
    "barrier",
    "nobarrier",
    "journal_checksum",
    "nojournal_checksum",
    "quota",
    "noquota",
    "usrquota",
    "grpquota",
    "prjquota",
    "delalloc",
    "nodelalloc",
    "auto_da_alloc",
    "noauto_da_alloc",
    "dioread_nolock",
    "dioread_lock",
    "init_itable",
    "noinit_itable",
    "block_validity",
    "noblock_validity",
    "commit=N",
    "stripe=N",
    "barrier=N",
    "init_itable=N",
    "max_batch_time=N",
    "min_batch_time=N",
    "journal_ioprio=N",
    "inode_readahead_blks=N",
    "data=ordered|writeback|journal",
    "errors=remount-ro|continue",
];
const XFS_DATA: &[&str] = &[
    "discard",
    "nodiscard",
    "inode32",
    "inode64",
    "largeio",
    "nolargeio",
    "noquota",
    "quota",
    "uquota",
    "usrquota",
    "gquota",
    "grpquota",
    "pquota",
    "prjquota",
    "uqnoenforce",
    "gqnoenforce",
    "pqnoenforce",
    "wsync",
    "filestreams",
    "swalloc",
    "noalign",
    "attr2",
    "noattr2",
    "ikeep",
    "noikeep",
    "nouuid",
    "logbufs=N",
    "logbsize=N",
    "allocsize=N",
    "sunit=N",
    "swidth=N",
];

#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct MountFlags {
    raw: Vec<String>,
    vfs: u64,
    data: Vec<String>,
}

impl MountFlags {
    pub fn parse(fs: FsType, raw: &[String]) -> Result<Self, ValidationError> {
        let total: usize = raw.iter().map(|s| s.len()).sum();
        if total > MAX_TOTAL_BYTES {
            return Err(ValidationError::TooLong {
                field: FIELD,
                max: MAX_TOTAL_BYTES,
            });
        }
        let mut flags = MountFlags {
            raw: raw.to_vec(),
            ..Default::default()
        };
        for item in raw {
            let item = item.trim();
            if item.is_empty() {
                continue;
            }
            if let Some(option) = selinux_option(item)? {
                let key = option.split('=').next().unwrap_or_default();
                if flags.data.iter().any(|d| d.split('=').next() == Some(key)) {
                    return Err(ValidationError::bad(
                        FIELD,
                        item,
                        "this SELinux option is given twice",
                    ));
                }
                flags.data.push(option);
                continue;
            }
            if item.len() > MAX_ITEM_BYTES
                || !item
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"=_-.".contains(&b))
            {
                return Err(ValidationError::bad(
                    FIELD,
                    item,
                    "mount options may hold only letters, digits, '=', '_', '-' and '.', one \
                     option per item",
                ));
            }
            if let Some((_, bits)) = VFS_FLAGS.iter().find(|(name, _)| *name == item) {
                flags.vfs |= bits;
                continue;
            }
            let table = if fs.is_ext() { EXT_DATA } else { XFS_DATA };
            if !table.iter().any(|pattern| matches_pattern(pattern, item)) {
                return Err(ValidationError::bad(
                    FIELD,
                    item,
                    format!("not a mount option the agent allows for {fs}"),
                ));
            }
            if !flags.data.iter().any(|d| d == item) {
                flags.data.push(item.to_string());
            }
        }
        if fs == FsType::Xfs && !flags.data.iter().any(|d| d == "nouuid") {
            // A volume and its snapshot clone share a UUID; xfs refuses the second without this.
            // Added here, once, so that a user's own `nouuid` is not passed twice.
            flags.data.push("nouuid".into());
        }
        Ok(flags)
    }

    /// The items as the CO sent them: compared for idempotency, echoed back in records.
    pub fn raw(&self) -> &[String] {
        &self.raw
    }

    /// mount(2) flag bits (`MS_*`).
    pub fn vfs_bits(&self) -> u64 {
        self.vfs
    }

    pub fn data(&self) -> &[String] {
        &self.data
    }

    pub fn wants_read_only(&self) -> bool {
        self.vfs & ms::RDONLY != 0
    }
}

/// `Some("context=\"u:r:t:s0:c1,c2\"")` for an SELinux option, quoted or not as given;
/// `None` for any other option.
fn selinux_option(item: &str) -> Result<Option<String>, ValidationError> {
    let Some((key, value)) = item.split_once('=') else {
        return Ok(None);
    };
    if !SELINUX_KEYS.contains(&key) {
        return Ok(None);
    }
    let context = match value.strip_prefix('"') {
        Some(inner) => inner.strip_suffix('"').unwrap_or(value),
        None => value,
    };
    if context.contains('"') || !is_selinux_context(context) {
        return Err(ValidationError::bad(
            FIELD,
            item,
            "not an SELinux context (user:role:type[:level], optionally in double quotes)",
        ));
    }
    Ok(Some(format!("{key}=\"{context}\"")))
}

/// `user:role:type` and an optional MLS/MCS range: `s0`, `s0:c1,c2`, `s0-s0:c0.c1023`.
fn is_selinux_context(c: &str) -> bool {
    let ident = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
    };
    let mut parts = c.splitn(4, ':');
    let named = (0..3).all(|_| parts.next().is_some_and(ident));
    c.len() <= MAX_ITEM_BYTES
        && named
        && parts.next().is_none_or(|range| {
            let (low, high) = range.split_once('-').unwrap_or((range, range));
            is_mls_level(low) && is_mls_level(high)
        })
}

fn is_mls_level(level: &str) -> bool {
    let numbered = |s: &str, prefix: char| {
        s.strip_prefix(prefix)
            .is_some_and(|n| !n.is_empty() && n.len() <= 4 && n.bytes().all(|b| b.is_ascii_digit()))
    };
    let (sensitivity, categories) = match level.split_once(':') {
        Some((s, cats)) => (s, Some(cats)),
        None => (level, None),
    };
    numbered(sensitivity, 's')
        && categories.is_none_or(|cats| {
            cats.split(',').all(|item| {
                let (from, to) = item.split_once('.').unwrap_or((item, item));
                numbered(from, 'c') && numbered(to, 'c')
            })
        })
}

fn matches_pattern(pattern: &str, item: &str) -> bool {
    match pattern.split_once('=') {
        None => pattern == item,
        Some((key, spec)) => {
            let Some((ikey, value)) = item.split_once('=') else {
                return false;
            };
            if key != ikey || value.is_empty() {
                return false;
            }
            if spec == "N" {
                value.len() <= 12 && value.bytes().all(|b| b.is_ascii_digit())
                    || value.len() <= 12
                        && value[..value.len() - 1].bytes().all(|b| b.is_ascii_digit())
                        && matches!(value.as_bytes()[value.len() - 1], b'k' | b'm' | b'g')
                        && value.len() > 1
            } else {
                spec.split('|').any(|choice| choice == value)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(fs: FsType, items: &[&str]) -> Result<MountFlags, ValidationError> {
        MountFlags::parse(fs, &items.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn accepts_common_options() {
        let f = parse(
            FsType::Ext4,
            &["noatime", "data=ordered", "commit=30", "ro"],
        )
        .unwrap();
        assert_eq!(f.vfs_bits(), ms::NOATIME | ms::RDONLY);
        assert_eq!(f.data(), ["data=ordered", "commit=30"]);
        assert!(f.wants_read_only());
        let x = parse(FsType::Xfs, &["inode64", "logbsize=256k"]).unwrap();
        assert_eq!(x.data(), ["inode64", "logbsize=256k", "nouuid"]);
    }

    #[test]
    fn kubelets_selinux_options_pass_checked_and_quoted() {
        let kubelet = "context=\"system_u:object_r:container_file_t:s0:c1,c2\"";
        let f = parse(FsType::Ext4, &[kubelet, "noatime"]).unwrap();
        assert_eq!(f.data(), [kubelet]);
        assert_eq!(f.raw(), [kubelet, "noatime"]);
        let unquoted = parse(
            FsType::Ext4,
            &["fscontext=system_u:object_r:t:s0-s0:c0.c1023"],
        )
        .unwrap();
        assert_eq!(
            unquoted.data(),
            ["fscontext=\"system_u:object_r:t:s0-s0:c0.c1023\""]
        );
        for ok in [
            "defcontext=\"u:r:t\"",
            "rootcontext=\"system_u:object_r:container_file_t:s0\"",
        ] {
            assert!(parse(FsType::Xfs, &[ok]).is_ok(), "{ok}");
        }
    }

    #[test]
    fn xfs_gets_nouuid_once_whoever_asks() {
        let own = parse(FsType::Xfs, &["inode64"]).unwrap();
        assert_eq!(own.data(), ["inode64", "nouuid"]);
        let user = parse(FsType::Xfs, &["nouuid", "inode64", "nouuid"]).unwrap();
        assert_eq!(user.data(), ["nouuid", "inode64"]);
        assert_eq!(parse(FsType::Ext4, &["noatime"]).unwrap().data().len(), 0);
    }

    #[test]
    fn refuses_escapes_and_unknowns() {
        for bad in [
            "noatime,bind",
            "bind",
            "remount",
            "rbind",
            "loop",
            "errors=panic",
            "data=evil",
            "commit=",
            "commit=1x",
            "a b",
            "x;rm -rf /",
            "context=\"x\"",
            "context=system_u:object_r:t:s0:c1,c2,bind",
            "context=\"system_u:object_r:t:s0\",bind",
            "context=\"a:b:c:s0\"\"",
            "context=a:b:c:s0:c1;reboot",
            "context=a:b:c:x0",
            "context=a:b",
            "seclabel=a:b:c",
            "nouuid=1",
        ] {
            assert!(parse(FsType::Ext4, &[bad]).is_err(), "{bad}");
        }
        assert!(parse(FsType::Xfs, &["data=ordered"]).is_err());
        assert!(parse(FsType::Ext4, &["nouuid"]).is_err());
        assert!(parse(FsType::Ext4, &["context=a:b:c:s0", "context=a:b:c:s1"]).is_err());
        assert!(parse(FsType::Ext4, &[&"a".repeat(300)]).is_err());
        let many: Vec<String> = (0..600).map(|_| "noatime".to_string()).collect();
        assert!(MountFlags::parse(FsType::Ext4, &many).is_err());
    }
}
