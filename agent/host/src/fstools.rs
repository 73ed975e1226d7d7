//! The filesystem tools: mkfs, fsck and grow, one place that knows their flags and exit codes.
//! Each runs with a timeout; its result is a typed error, never a guess from stderr.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use crate::command;
use crate::fs_limits::{SizeLimits, parse_xfsprogs_version};
use crate::mkfs_args::mkfs_args;
use ebs_node_core::request::{FormatOptions, FsType};

pub const MKFS_TIMEOUT: Duration = Duration::from_secs(600);
pub const FSCK_TIMEOUT: Duration = Duration::from_secs(600);
pub const GROW_TIMEOUT: Duration = Duration::from_secs(300);

use ebs_node_core::seam::{FsToolError, MissingTools};

pub type Result<T, E = FsToolError> = std::result::Result<T, E>;

const SEARCH_PATH: &[&str] = &["/usr/sbin", "/sbin", "/usr/bin", "/bin"];

/// `--legacy-xfs`: the xfs features Linux 5.4 and older cannot mount, turned off (the upstream
/// driver's set since v1.50, with [`LEGACY_XFS_INODE_FEATURES`]).
pub const LEGACY_XFS_FEATURES: &str = "bigtime=0,inobtcount=0,reflink=0";
/// Large extent counters (xfsprogs 5.19 and later know the option; some 6.x releases turn the
/// feature on by default), which Amazon Linux 2 kernels cannot mount.
pub const LEGACY_XFS_INODE_FEATURES: &str = "nrext64=0";
/// The first xfsprogs whose mkfs.xfs accepts `-i nrext64=`.
const NREXT64_SINCE: (u32, u32) = (5, 19);

/// Which filesystems this host can format, check and grow, found once at start.
#[derive(Clone, Debug)]
pub struct FsTools {
    tools: HashMap<&'static str, PathBuf>,
    legacy_xfs: bool,
    /// xfsprogs' version (major, minor), asked of mkfs.xfs the first time an xfs size is checked:
    /// its smallest filesystem changed with 5.19.
    xfsprogs: OnceLock<Option<(u32, u32)>>,
}

fn required_tools(fs: FsType) -> &'static [&'static str] {
    match fs {
        FsType::Ext4 => &["mkfs.ext4", "e2fsck", "resize2fs"],
        FsType::Ext3 => &["mkfs.ext3", "e2fsck", "resize2fs"],
        FsType::Xfs => &["mkfs.xfs", "xfs_growfs"],
    }
}

use ebs_node_core::seam::FsckOutcome;

impl FsTools {
    pub fn detect() -> Self {
        let mut tools = HashMap::new();
        for fs in FsType::ALL {
            for tool in required_tools(fs) {
                if let Some(path) = SEARCH_PATH
                    .iter()
                    .map(|dir| Path::new(dir).join(tool))
                    .find(|p| p.is_file())
                {
                    tools.insert(*tool, path);
                }
            }
        }
        FsTools {
            tools,
            legacy_xfs: false,
            xfsprogs: OnceLock::new(),
        }
    }

    /// Formats xfs for old kernels from now on (`--legacy-xfs`).
    pub fn with_legacy_xfs(mut self, on: bool) -> Self {
        self.legacy_xfs = on;
        self
    }

    /// `Err` names the missing tools and the package that brings them.
    pub fn supports(&self, fs: FsType) -> std::result::Result<(), MissingTools> {
        let tools: Vec<&'static str> = required_tools(fs)
            .iter()
            .filter(|t| !self.tools.contains_key(*t))
            .copied()
            .collect();
        if tools.is_empty() {
            return Ok(());
        }
        let package = if fs.is_ext() { "e2fsprogs" } else { "xfsprogs" };
        Err(MissingTools { tools, package })
    }

    fn tool(&self, fs: FsType, name: &'static str) -> Result<&Path> {
        self.supports(fs)
            .map_err(|missing| FsToolError::Unavailable {
                fs,
                why: missing.to_string(),
            })?;
        self.tools
            .get(name)
            .map(PathBuf::as_path)
            .ok_or_else(|| FsToolError::Unavailable {
                fs,
                why: format!("missing {name}"),
            })
    }

    /// Formats `device` with a UUID chosen in advance, so that an interrupted mkfs can be
    /// recognised as ours on restart.
    pub fn mkfs(&self, fs: FsType, device: &Path, uuid: &str, opts: &FormatOptions) -> Result<()> {
        let tool = match fs {
            FsType::Ext4 => self.tool(fs, "mkfs.ext4")?,
            FsType::Ext3 => self.tool(fs, "mkfs.ext3")?,
            FsType::Xfs => self.tool(fs, "mkfs.xfs")?,
        };
        let legacy = if self.legacy_xfs && fs == FsType::Xfs {
            legacy_xfs_args(self.xfsprogs_version())
        } else {
            Vec::new()
        };
        let mut args = mkfs_args(fs, uuid, &legacy, opts.mkfs_args(fs));
        args.push(device_arg(device)?);
        let out = command::run(tool, &args, MKFS_TIMEOUT)?;
        succeeded(tool, device, &out)
    }

    /// Checks a filesystem before it is mounted: `e2fsck -p` for ext, nothing for xfs.
    pub fn check(&self, fs: FsType, device: &Path) -> Result<FsckOutcome> {
        if fs == FsType::Xfs {
            return Ok(FsckOutcome::NotNeeded);
        }
        let tool = self.tool(fs, "e2fsck")?;
        let out = command::run(tool, &["-p".to_string(), device_arg(device)?], FSCK_TIMEOUT)?;
        match out.code {
            0 => Ok(FsckOutcome::Clean),
            1 | 2 => Ok(FsckOutcome::Repaired(out.code)),
            code => Err(FsToolError::FsckFailed {
                device: device.into(),
                code,
                summary: reason(&format!("{}{}", out.stdout, out.stderr)),
            }),
        }
    }

    /// Grows a mounted filesystem to its device: resize2fs takes the device, xfs_growfs the mount.
    pub fn grow(&self, fs: FsType, device: &Path, mount_point: &Path) -> Result<()> {
        let (tool, arg) = match fs {
            FsType::Xfs => (self.tool(fs, "xfs_growfs")?, mount_point),
            _ => (self.tool(fs, "resize2fs")?, device),
        };
        let out = command::run(tool, &[device_arg(arg)?], GROW_TIMEOUT)?;
        succeeded(tool, device, &out)
    }
}

impl FsTools {
    /// Refuses, before anything is journaled or run, a device whose size mkfs would refuse for
    /// `fs`: OUT_OF_RANGE naming the limit, instead of a failed mkfs after a journaled intent.
    pub fn check_size(&self, fs: FsType, device: &Path, opts: &FormatOptions) -> Result<()> {
        let bytes = crate::device::size(device).map_err(|e| FsToolError::Sizing {
            device: device.into(),
            source: e,
        })?;
        let xfsprogs = match fs {
            FsType::Xfs => self.xfsprogs_version(),
            _ => None,
        };
        let limits = SizeLimits::of(fs, xfsprogs, opts.block_size);
        limits
            .check(fs, bytes)
            .map_err(|why| FsToolError::DoesNotFit {
                device: device.into(),
                why: why.to_string(),
            })
    }

    fn xfsprogs_version(&self) -> Option<(u32, u32)> {
        *self.xfsprogs.get_or_init(|| {
            let tool = self.tools.get("mkfs.xfs")?;
            let out = command::run(tool, &["-V".to_string()], Duration::from_secs(10)).ok()?;
            parse_xfsprogs_version(&out.stdout)
        })
    }
}

impl FsTools {
    /// Grows an unmounted ext filesystem: a forced check first (resize2fs refuses without one),
    /// then resize2fs. Works without CAP_SYS_RESOURCE, which only the online path needs.
    pub fn grow_offline(&self, fs: FsType, device: &Path) -> Result<()> {
        let dev = device_arg(device)?;
        let fsck = self.tool(fs, "e2fsck")?;
        let out = command::run(
            fsck,
            &["-f".to_string(), "-p".to_string(), dev.clone()],
            FSCK_TIMEOUT,
        )?;
        if out.code >= 4 {
            return Err(FsToolError::FsckFailed {
                device: device.into(),
                code: out.code,
                summary: reason(&format!("{}{}", out.stdout, out.stderr)),
            });
        }
        let tool = self.tool(fs, "resize2fs")?;
        let out = command::run(tool, &[dev], GROW_TIMEOUT)?;
        succeeded(tool, device, &out)
    }
}

/// `--legacy-xfs`'s mkfs.xfs options for the installed xfsprogs: the upstream driver's exact set,
/// less `-i nrext64=0` where mkfs.xfs is too old to know it (it would refuse the option, and such
/// an mkfs.xfs never makes the feature anyway).
pub(crate) fn legacy_xfs_args(xfsprogs: Option<(u32, u32)>) -> Vec<String> {
    let mut args = vec!["-m".to_string(), LEGACY_XFS_FEATURES.to_string()];
    match xfsprogs {
        Some(v) if v >= NREXT64_SINCE => {
            args.extend(["-i".to_string(), LEGACY_XFS_INODE_FEATURES.to_string()]);
        }
        _ => {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                tracing::info!(
                    xfsprogs = ?xfsprogs,
                    "--legacy-xfs: mkfs.xfs predates nrext64 (xfsprogs 5.19), so -i nrext64=0 is left out"
                );
            });
        }
    }
    args
}

/// A tool's non-zero exit as a typed error that leads with the tool's reason.
fn succeeded(tool: &Path, device: &Path, out: &command::CommandOutput) -> Result<()> {
    if out.code == 0 {
        return Ok(());
    }
    Err(FsToolError::ToolFailed {
        tool: tool.display().to_string(),
        device: device.into(),
        code: out.code,
        stderr: reason(preferred_output(out)),
    })
}

fn device_arg(path: &Path) -> Result<String> {
    path.to_str()
        .map(str::to_string)
        .ok_or_else(|| FsToolError::NonUtf8Path(path.into()))
}

/// Where a tool says why it failed: stderr, or stdout when stderr is empty.
fn preferred_output(out: &command::CommandOutput) -> &str {
    if out.stderr.trim().is_empty() {
        &out.stdout
    } else {
        &out.stderr
    }
}

/// Why a tool failed, in its own words: its first meaningful line and what follows, up to the usage text some tools print after the reason (mkfs.xfs:
/// "Filesystem must be larger than 300MB." then forty lines of usage). Version banners and
/// blank lines are skipped; the result is bounded for a gRPC message, its start kept.
fn reason(text: &str) -> String {
    let mut lines = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if line.to_ascii_lowercase().starts_with("usage:") {
            break;
        }
        if !is_banner(line) {
            lines.push(line);
        }
    }
    bounded(&lines.join("; "), 600)
}

/// `mke2fs 1.47.0 (5-Feb-2023)`: a name, a version, maybe a date; says nothing about the failure.
fn is_banner(line: &str) -> bool {
    let words: Vec<&str> = line.split_whitespace().collect();
    let version = |w: &str| {
        w.starts_with(|c: char| c.is_ascii_digit())
            && w.contains('.')
            && w.chars().all(|c| c.is_ascii_digit() || c == '.')
    };
    words.len() >= 2 && version(words[1]) && (words.len() == 2 || line.ends_with(')'))
}

fn bounded(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut cut = max;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}…", &text[..cut])
}

/// The size a filesystem believes it has, read from its superblock (ext and xfs), so a stage can
/// tell whether the device grew under it (a snapshot restored into a larger volume).
pub fn filesystem_bytes(fs: FsType, device: &Path) -> std::io::Result<u64> {
    filesystem_bytes_of(fs, &std::fs::File::open(device)?)
}

fn superblock_lies(fs: &str) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!("the {fs} superblock's size overflows 64 bits"),
    )
}

/// As [`filesystem_bytes`], through a device that is already open.
pub fn filesystem_bytes_of(fs: FsType, file: &std::fs::File) -> std::io::Result<u64> {
    use std::os::unix::fs::FileExt;
    let mut sb = [0u8; 512];
    match fs {
        FsType::Xfs => {
            file.read_exact_at(&mut sb, 0)?;
            let block = u64::from(u32::from_be_bytes([sb[4], sb[5], sb[6], sb[7]]));
            let mut d = [0u8; 8];
            d.copy_from_slice(&sb[8..16]);
            // The superblock is the device's, not ours: a size that overflows is no size.
            u64::from_be_bytes(d)
                .checked_mul(block)
                .ok_or_else(|| superblock_lies("xfs"))
        }
        _ => {
            file.read_exact_at(&mut sb, 1024)?;
            let lo = u64::from(u32::from_le_bytes([sb[4], sb[5], sb[6], sb[7]]));
            let log = u32::from_le_bytes([sb[24], sb[25], sb[26], sb[27]]);
            let mut blocks = lo;
            // 64bit feature: the high half of the block count lives at 0x150, inside the 512
            // bytes already read.
            let incompat = u32::from_le_bytes([sb[96], sb[97], sb[98], sb[99]]);
            if incompat & 0x80 != 0 {
                let hi = u32::from_le_bytes([sb[0x150], sb[0x151], sb[0x152], sb[0x153]]);
                blocks |= u64::from(hi) << 32;
            }
            blocks
                .checked_mul(1 << (10 + log.min(6)))
                .ok_or_else(|| superblock_lies("ext"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A superblock is the device's, and a device may be anyone's: a size that overflows is an
    /// error, not a panic (debug) or a wrapped, small size (release) that a grow would trust.
    #[test]
    fn a_superblock_whose_size_overflows_is_refused() {
        use std::os::unix::fs::FileExt;
        let t = crate::loopdev::test_support::TempFile::sparse("sb-overflow", 4096);
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&t.0)
            .unwrap();
        // xfs: block size 64 KiB, 2^60 data blocks.
        f.write_all_at(&65536u32.to_be_bytes(), 4).unwrap();
        f.write_all_at(&(1u64 << 60).to_be_bytes(), 8).unwrap();
        let e = filesystem_bytes_of(FsType::Xfs, &f).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData, "{e}");
        // ext4, 64bit: 2^63 blocks of 64 KiB.
        f.write_all_at(&[0u8; 1024], 1024).unwrap();
        f.write_all_at(&6u32.to_le_bytes(), 1024 + 24).unwrap();
        f.write_all_at(&0x80u32.to_le_bytes(), 1024 + 96).unwrap();
        f.write_all_at(&(1u32 << 31).to_le_bytes(), 1024 + 0x150)
            .unwrap();
        let e = filesystem_bytes_of(FsType::Ext4, &f).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData, "{e}");
        // A sane ext4: 1000 blocks of 4 KiB.
        f.write_all_at(&[0u8; 1024], 1024).unwrap();
        f.write_all_at(&1000u32.to_le_bytes(), 1024 + 4).unwrap();
        f.write_all_at(&2u32.to_le_bytes(), 1024 + 24).unwrap();
        assert_eq!(filesystem_bytes_of(FsType::Ext4, &f).unwrap(), 4_096_000);
    }

    const MKFS_XFS_TOO_SMALL: &str = "Filesystem must be larger than 300MB.\nUsage: mkfs.xfs\n\
        /* blocksize */\t\t[-b size=num]\n/* config file */\t[-c options=xxx]\n\
        <value> is xxx (512 byte blocks).\n";

    #[test]
    fn legacy_xfs_is_upstreams_option_set_where_mkfs_knows_it() {
        let full = ["-m", "bigtime=0,inobtcount=0,reflink=0", "-i", "nrext64=0"];
        assert_eq!(legacy_xfs_args(Some((6, 1))), full);
        assert_eq!(legacy_xfs_args(Some((5, 19))), full);
        assert_eq!(legacy_xfs_args(Some((5, 18))), full[..2]);
        assert_eq!(legacy_xfs_args(None), full[..2]);
    }

    #[test]
    fn a_failed_tool_leads_with_its_reason_not_its_usage() {
        assert_eq!(
            reason(MKFS_XFS_TOO_SMALL),
            "Filesystem must be larger than 300MB."
        );
        let text = "mke2fs 1.47.0 (5-Feb-2023)\n\n/dev/loop9: Not enough space to build \
                    proposed filesystem while setting up superblock\n";
        assert_eq!(
            reason(text),
            "/dev/loop9: Not enough space to build proposed filesystem while setting up superblock"
        );
        assert_eq!(reason("a\n\nb\n"), "a; b");
        let long = reason(&"x".repeat(5000));
        assert!(
            long.starts_with("xxx") && long.len() <= 604,
            "{}",
            long.len()
        );
    }
}
