//! The sizes mkfs accepts per filesystem: checked before a format is journaled, so a volume
//! mkfs would refuse is refused up front with the limit named.

use ebs_node_core::request::FsType;

/// The sizes mkfs accepts for a filesystem, in bytes.
#[derive(Debug, PartialEq, Eq)]
pub struct SizeLimits {
    pub min: u64,
    pub max: Option<u64>,
    /// Why the limits are what they are, for the refusal's message.
    pub source: &'static str,
}

const MIB: u64 = 1 << 20;

impl SizeLimits {
    /// `xfsprogs` is the installed version (None: unknown, the current rule applies);
    /// `block_size` the requested one (None: mkfs's default, 4 KiB at these sizes).
    pub fn of(fs: FsType, xfsprogs: Option<(u32, u32)>, block_size: Option<u64>) -> Self {
        let block = block_size.unwrap_or(4096);
        match fs {
            // xfsprogs 5.19 stopped making filesystems under 300 MiB ("Filesystem must be larger
            // than 300MB."); before it, one allocation group of 16 MiB was the floor.
            FsType::Xfs => match xfsprogs {
                Some(v) if v < (5, 19) => SizeLimits {
                    min: 16 * MIB,
                    max: None,
                    source: "xfsprogs before 5.19",
                },
                _ => SizeLimits {
                    min: 300 * MIB,
                    max: None,
                    source: "xfsprogs 5.19 and later",
                },
            },
            // Without the 64bit feature a block number has 32 bits; mke2fs refuses a device of
            // 2^32 blocks or more ("too big to be expressed in 32 bits").
            FsType::Ext3 => SizeLimits {
                min: MIB,
                max: Some(((1u64 << 32) - 1) * block),
                source: "ext3 block numbers have 32 bits",
            },
            // ext4 (64bit, extents) addresses 2^48 blocks.
            FsType::Ext4 => SizeLimits {
                min: MIB,
                max: Some((1u64 << 48) * block),
                source: "ext4 addresses 2^48 blocks",
            },
        }
    }

    /// `Err` says which limit the size breaks, in words a person can act on.
    pub fn check(&self, fs: FsType, bytes: u64) -> std::result::Result<(), SizeLimitError> {
        if bytes < self.min {
            return Err(SizeLimitError::TooSmall {
                fs,
                min: self.min,
                rule: self.source,
                bytes,
            });
        }
        match self.max {
            Some(max) if bytes > max => Err(SizeLimitError::TooLarge {
                fs,
                max,
                rule: self.source,
                bytes,
            }),
            _ => Ok(()),
        }
    }
}

/// A size mkfs would refuse for the filesystem, with the rule that sets the limit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeLimitError {
    #[error(
        "{fs} needs at least {} ({rule}), and the device has {}: create a larger volume or ask \
         for another filesystem", bytes_in_words(*.min), bytes_in_words(*.bytes)
    )]
    TooSmall {
        fs: FsType,
        min: u64,
        rule: &'static str,
        bytes: u64,
    },
    #[error(
        "{fs} holds at most {} ({rule}), and the device has {}: use ext4 or xfs, or a larger \
         block size", bytes_in_words(*.max), bytes_in_words(*.bytes)
    )]
    TooLarge {
        fs: FsType,
        max: u64,
        rule: &'static str,
        bytes: u64,
    },
}

/// `mkfs.xfs version 6.1.0` → (6, 1).
pub fn parse_xfsprogs_version(text: &str) -> Option<(u32, u32)> {
    let version = text.split_whitespace().last()?;
    let mut parts = version.split('.').map(|p| p.parse::<u32>().ok());
    Some((parts.next()??, parts.next()??))
}

/// `300 MiB (314572800 bytes)`.
fn bytes_in_words(bytes: u64) -> String {
    let units = [
        (1u64 << 40, "TiB"),
        (1 << 30, "GiB"),
        (MIB, "MiB"),
        (1 << 10, "KiB"),
    ];
    for (size, unit) in units {
        if bytes >= size && bytes.is_multiple_of(size) {
            return format!("{} {unit} ({bytes} bytes)", bytes / size);
        }
    }
    format!("{bytes} bytes")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_limits_name_the_rule() {
        let current = SizeLimits::of(FsType::Xfs, Some((6, 1)), None);
        assert_eq!(current.min, 300 << 20);
        let err = current
            .check(FsType::Xfs, 64 << 20)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("at least 300 MiB") && err.contains("64 MiB"),
            "{err}"
        );
        assert!(current.check(FsType::Xfs, 300 << 20).is_ok());
        assert_eq!(
            SizeLimits::of(FsType::Xfs, Some((5, 18)), None).min,
            16 << 20
        );
        assert_eq!(SizeLimits::of(FsType::Xfs, None, None).min, 300 << 20);

        let ext3 = SizeLimits::of(FsType::Ext3, None, None);
        assert!(ext3.check(FsType::Ext3, (1 << 44) - 4096).is_ok());
        let err = ext3.check(FsType::Ext3, 1 << 44).unwrap_err().to_string();
        assert!(err.contains("at most") && err.contains("32 bits"), "{err}");
        assert!(
            SizeLimits::of(FsType::Ext3, None, Some(1024))
                .check(FsType::Ext3, 1 << 42)
                .is_err()
        );
        let ext4 = SizeLimits::of(FsType::Ext4, None, None);
        assert!(ext4.check(FsType::Ext4, 64 << 40).is_ok());
        assert!(ext4.check(FsType::Ext4, 512 << 10).is_err());
    }

    #[test]
    fn xfsprogs_versions() {
        assert_eq!(
            parse_xfsprogs_version("mkfs.xfs version 6.1.0\n"),
            Some((6, 1))
        );
        assert_eq!(
            parse_xfsprogs_version("mkfs.xfs version 5.19.0"),
            Some((5, 19))
        );
        assert_eq!(parse_xfsprogs_version("garbage"), None);
    }
}
