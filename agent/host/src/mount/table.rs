//! Parser for `/proc/self/mountinfo` (see proc(5)).
//!
//! Line format:
//! `36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue`
//! The kernel octal-escapes space, tab, newline and backslash but passes other
//! bytes through unchanged, so paths may be non-UTF-8: we parse bytes.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    pub mount_id: u32,
    pub parent_id: u32,
    pub major: u32,
    pub minor: u32,
    /// Path inside the filesystem that is mounted; not "/" for bind mounts
    /// of a subdirectory.
    pub root: PathBuf,
    pub mount_point: PathBuf,
    /// Per-mount options (e.g. "rw,nosuid,relatime").
    pub mount_options: String,
    pub fs_type: String,
    pub source: String,
    /// Per-superblock options, shared by every mount of the filesystem.
    pub super_options: String,
    /// Its peer group (`shared:N`): mounts that propagate to one another.
    pub peer_group: Option<u32>,
    /// The peer group it receives from (`master:N`), a slave's.
    pub master: Option<u32>,
}

fn has_option(options: &str, name: &str) -> bool {
    options.split(',').any(|o| o == name)
}

impl MountEntry {
    pub fn is_read_only(&self) -> bool {
        has_option(&self.mount_options, "ro")
    }

    /// Its files' owners shown through an id mapping.
    pub fn idmapped(&self) -> bool {
        has_option(&self.mount_options, "idmapped")
    }

    /// Its nosuid, nodev and noexec, as mount(2)'s bits.
    pub fn vfs_bits(&self) -> u64 {
        use ebs_node_core::request::ms;
        [
            ("nosuid", ms::NOSUID),
            ("nodev", ms::NODEV),
            ("noexec", ms::NOEXEC),
        ]
        .iter()
        .filter(|(name, _)| has_option(&self.mount_options, name))
        .fold(0, |bits, (_, m)| bits | m)
    }

    /// True when the filesystem itself is read-only (e.g. ext4 remounted ro
    /// after errors), which affects every mount of it.
    pub fn super_read_only(&self) -> bool {
        has_option(&self.super_options, "ro")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum MountInfoError {
    #[error("cannot read {path:?}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("mountinfo line {line}: {reason}")]
    Parse { line: usize, reason: String },
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MountTable {
    entries: Vec<MountEntry>,
}

const MOUNTINFO: &str = "/proc/self/mountinfo";

impl MountTable {
    pub fn parse(text: &str) -> Result<Self, MountInfoError> {
        Self::parse_bytes(text.as_bytes())
    }

    /// Like `parse`, for raw file contents that need not be UTF-8.
    pub fn parse_bytes(bytes: &[u8]) -> Result<Self, MountInfoError> {
        let entries = bytes
            .split(|&b| b == b'\n')
            .enumerate()
            .filter(|(_, l)| !l.is_empty())
            .map(|(i, l)| {
                parse_line(l).map_err(|reason| MountInfoError::Parse {
                    line: i + 1,
                    reason,
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(MountTable { entries })
    }

    pub fn read() -> Result<Self, MountInfoError> {
        use std::io::Read;
        let failed = |source| MountInfoError::Read {
            path: PathBuf::from(MOUNTINFO),
            source,
        };
        // /proc reports a size of 0, so `fs::read` starts at 32 bytes and doubles: eight
        // reads for a host with 50 mounts, each resuming the kernel's walk of the table. Room
        // for about 100 lines up front makes it one or two.
        let mut bytes = Vec::with_capacity(16 * 1024);
        std::fs::File::open(MOUNTINFO)
            .and_then(|mut f| f.read_to_end(&mut bytes))
            .map_err(failed)?;
        Self::parse_bytes(&bytes)
    }

    /// The top-most mount exactly at `path`: when several mounts stack on the
    /// same point, the kernel lists the most recent (visible) one last.
    pub fn at(&self, path: &Path) -> Option<&MountEntry> {
        self.entries.iter().rev().find(|e| e.mount_point == path)
    }

    pub fn mounts_of_device(&self, major: u32, minor: u32) -> impl Iterator<Item = &MountEntry> {
        self.entries
            .iter()
            .filter(move |e| e.major == major && e.minor == minor)
    }

    pub fn entries(&self) -> &[MountEntry] {
        &self.entries
    }

    pub fn is_mount_point(&self, path: &Path) -> bool {
        self.at(path).is_some()
    }
}

/// Decodes the kernel's `\ooo` escapes; anything else is kept verbatim.
fn unescape(field: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        if field[i] == b'\\' && i + 4 <= field.len() {
            let digits = &field[i + 1..i + 4];
            if digits.iter().all(|d| (b'0'..=b'7').contains(d)) {
                let value = digits
                    .iter()
                    .fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
                if let Ok(byte) = u8::try_from(value) {
                    out.push(byte);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(field[i]);
        i += 1;
    }
    out
}

fn path_field(field: &[u8]) -> PathBuf {
    PathBuf::from(OsString::from_vec(unescape(field)))
}

fn string_field(field: &[u8]) -> String {
    String::from_utf8_lossy(&unescape(field)).into_owned()
}

fn number<T: std::str::FromStr>(field: &[u8], what: &str) -> Result<T, String> {
    std::str::from_utf8(field)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("invalid {what} {:?}", String::from_utf8_lossy(field)))
}

fn parse_line(line: &[u8]) -> Result<MountEntry, String> {
    // Split on single spaces (not runs): an empty source shows up as an
    // empty field between two spaces.
    let fields: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
    if fields.len() < 10 {
        return Err(format!("expected at least 10 fields, got {}", fields.len()));
    }
    // Optional fields start at index 6; searching from there keeps a path
    // that happens to be "-" from being mistaken for the separator.
    let sep = 6 + fields[6..]
        .iter()
        .position(|f| *f == b"-")
        .ok_or("missing ' - ' separator")?;
    if fields.len() != sep + 4 {
        return Err(format!(
            "expected 3 fields after ' - ', got {}",
            fields.len() - sep - 1
        ));
    }
    let (major, minor) = {
        let s = fields[2];
        let colon = s
            .iter()
            .position(|&b| b == b':')
            .ok_or_else(|| format!("invalid major:minor {:?}", String::from_utf8_lossy(s)))?;
        (
            number(&s[..colon], "major")?,
            number(&s[colon + 1..], "minor")?,
        )
    };
    Ok(MountEntry {
        mount_id: number(fields[0], "mount id")?,
        parent_id: number(fields[1], "parent id")?,
        major,
        minor,
        root: path_field(fields[3]),
        mount_point: path_field(fields[4]),
        mount_options: string_field(fields[5]),
        fs_type: string_field(fields[sep + 1]),
        source: string_field(fields[sep + 2]),
        super_options: string_field(fields[sep + 3]),
        peer_group: tagged(&fields[6..sep], b"shared:"),
        master: tagged(&fields[6..sep], b"master:"),
    })
}

/// The number of the optional field `tag:N`.
fn tagged(optional: &[&[u8]], tag: &[u8]) -> Option<u32> {
    optional
        .iter()
        .find_map(|f| f.strip_prefix(tag))
        .and_then(|n| std::str::from_utf8(n).ok()?.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStrExt;

    const SAMPLE: &str = "\
22 1 253:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw,errors=remount-ro
23 22 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw
36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
40 22 7:3 / /var/lib/kubelet/plugins/vol\\040one rw,relatime shared:30 master:2 propagate_from:5 - xfs /dev/loop3 rw,attr2,inode64
41 22 7:3 /sub/dir /var/lib/kubelet/pods/p1/volumes/v ro,relatime - xfs /dev/loop3 rw,attr2,inode64
42 22 7:3 / /var/lib/kubelet/plugins/vol\\040one ro,relatime - xfs /dev/loop3 ro,attr2
50 22 0:45 / /tmp/weird\\011tab\\012nl\\134bs rw - tmpfs my\\040src rw,size=1024k
51 22 0:46 / /tmp/empty-source rw - tmpfs  rw
";

    fn table() -> MountTable {
        MountTable::parse(SAMPLE).unwrap()
    }

    #[test]
    fn parses_basic_fields() {
        let t = table();
        assert_eq!(t.entries().len(), 8);
        let root = &t.entries()[0];
        assert_eq!(
            (root.mount_id, root.parent_id, root.major, root.minor),
            (22, 1, 253, 1)
        );
        assert_eq!(root.root, Path::new("/"));
        assert_eq!(root.mount_point, Path::new("/"));
        assert_eq!(root.mount_options, "rw,relatime");
        assert_eq!(root.fs_type, "ext4");
        assert_eq!(root.source, "/dev/vda1");
        assert_eq!(root.super_options, "rw,errors=remount-ro");
        assert!(!root.is_read_only());
    }

    #[test]
    fn proc5_example_with_bind_root() {
        let t = table();
        let e = &t.entries()[2];
        assert_eq!((e.mount_id, e.parent_id, e.major, e.minor), (36, 35, 98, 0));
        assert_eq!(e.root, Path::new("/mnt1"));
        assert_eq!(e.mount_point, Path::new("/mnt2"));
        assert_eq!(e.source, "/dev/root");
        assert_eq!(e.super_options, "rw,errors=continue");
    }

    #[test]
    fn optional_fields_zero_or_many() {
        let t = table();
        let many = &t.entries()[3];
        assert_eq!(many.fs_type, "xfs");
        assert_eq!(many.source, "/dev/loop3");
        assert_eq!((many.peer_group, many.master), (Some(30), Some(2)));
        assert_eq!(
            (t.entries()[2].peer_group, t.entries()[2].master),
            (None, Some(1))
        );
        let none = &t.entries()[4];
        assert_eq!((none.peer_group, none.master), (None, None));
        assert_eq!(none.fs_type, "xfs");
        assert_eq!(none.root, Path::new("/sub/dir"));
        assert!(none.is_read_only());
        assert!(!none.super_read_only());
    }

    #[test]
    fn escapes_are_decoded() {
        let t = table();
        let e = &t.entries()[6];
        assert_eq!(e.mount_point, Path::new("/tmp/weird\ttab\nnl\\bs"));
        assert_eq!(e.source, "my src");
        assert!(t.is_mount_point(Path::new("/var/lib/kubelet/plugins/vol one")));
        assert_eq!(unescape(b"a\\040b\\9zz\\04"), b"a b\\9zz\\04");
        assert_eq!(unescape(b"\\777"), b"\\777");
        assert_eq!(unescape(b"end\\"), b"end\\");
    }

    #[test]
    fn empty_source_field() {
        let t = table();
        let e = &t.entries()[7];
        assert_eq!(e.fs_type, "tmpfs");
        assert_eq!(e.source, "");
        assert_eq!(e.super_options, "rw");
    }

    #[test]
    fn stacked_mounts_pick_last() {
        let t = table();
        let top = t.at(Path::new("/var/lib/kubelet/plugins/vol one")).unwrap();
        assert_eq!(top.mount_id, 42);
        assert!(top.is_read_only() && top.super_read_only());
        assert!(
            t.at(Path::new("/var/lib/kubelet/plugins/vol one/"))
                .is_some()
        );
        assert!(t.at(Path::new("/var/lib/kubelet")).is_none());
        assert!(!t.is_mount_point(Path::new("/nope")));
    }

    #[test]
    fn same_device_in_several_places() {
        let t = table();
        let ids: Vec<u32> = t.mounts_of_device(7, 3).map(|e| e.mount_id).collect();
        assert_eq!(ids, vec![40, 41, 42]);
        assert_eq!(t.mounts_of_device(7, 4).count(), 0);
    }

    #[test]
    fn non_utf8_paths_survive() {
        let line = b"60 22 8:16 / /mnt/\xff\xfe\\040x rw - ext4 /dev/sdb rw\n";
        let t = MountTable::parse_bytes(line).unwrap();
        let mp = &t.entries()[0].mount_point;
        assert_eq!(mp.as_os_str().as_bytes(), b"/mnt/\xff\xfe x");
        let octal = MountTable::parse("61 22 8:16 / /mnt/\\377 rw - ext4 /dev/sdb rw").unwrap();
        assert_eq!(
            octal.entries()[0].mount_point.as_os_str().as_bytes(),
            b"/mnt/\xff"
        );
    }

    #[test]
    fn malformed_lines_report_line_number() {
        for bad in [
            "22 1 253:1 / / rw,relatime shared:1 ext4 /dev/vda1 rw",
            "22 1 2531 / / rw - ext4 /dev/vda1 rw",
            "x 1 253:1 / / rw - ext4 /dev/vda1 rw",
            "22 1 253:1 / / rw - ext4 /dev/vda1",
            "22 1 253:1 / / rw - ext4 /dev/vda1 rw extra",
            "22 1 253:1 / rw - ext4 /dev/vda1 rw",
        ] {
            let text = format!("{}\n{bad}\n", SAMPLE.lines().next().unwrap());
            match MountTable::parse(&text) {
                Err(MountInfoError::Parse { line: 2, .. }) => {}
                other => panic!("{bad:?}: {other:?}"),
            }
        }
        assert!(MountTable::parse("").unwrap().entries().is_empty());
    }

    #[test]
    fn sees_a_real_mount_with_a_space_in_its_path() {
        use crate::loopdev::test_support::{Loop, TempFile, root_or_skip, sh};
        if !root_or_skip("sees_a_real_mount_with_a_space_in_its_path") {
            return;
        }
        let f = TempFile::sparse("mnt", 32 << 20);
        let lo = Loop::attach(&f.0);
        sh(&format!("mkfs.ext4 -q -F {}", lo.0.display()));
        // Unmounts (if mounted) and removes the directory, even on panic.
        struct Unmount(PathBuf);
        impl Drop for Unmount {
            fn drop(&mut self) {
                let _ = std::process::Command::new("umount").arg(&self.0).status();
                let _ = std::fs::remove_dir(&self.0);
            }
        }
        let dir = Unmount(f.0.with_extension("mnt dir"));
        std::fs::create_dir(&dir.0).unwrap();
        sh(&format!(
            "mount -o ro '{}' '{}'",
            lo.0.display(),
            dir.0.display()
        ));
        let t = MountTable::read().unwrap();
        let e = t.at(&dir.0).unwrap();
        assert_eq!(e.fs_type, "ext4");
        assert_eq!(e.source, lo.0.to_string_lossy());
        assert!(e.is_read_only());
        let minor = std::fs::read_to_string(format!(
            "/sys/block/{}/dev",
            lo.0.file_name().unwrap().to_string_lossy()
        ))
        .unwrap();
        assert_eq!(format!("{}:{}", e.major, e.minor), minor.trim());
        assert_eq!(t.mounts_of_device(e.major, e.minor).count(), 1);
    }

    #[test]
    fn reads_own_mountinfo() {
        // Not "/": in a chroot (a package builder's) the root is no mount point. The table is
        // read through proc, so a proc mount is in it wherever this runs.
        let t = MountTable::read().unwrap();
        let proc_mount = t.entries().iter().find(|e| e.fs_type == "proc").unwrap();
        assert!(t.is_mount_point(&proc_mount.mount_point));
    }
}
