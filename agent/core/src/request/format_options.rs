//! Format options from volume_context (the EBS driver's keys). Their values reach mkfs's argument
//! list, so each is parsed as a number or boolean, range-checked, and allowed only for the
//! filesystems that have it.
//!
//! Keys are matched without regard to case, as upstream matches them: its controller writes them
//! in lowercase (`blocksize`), StorageClasses and static volumes often carry the camelCase form
//! (`blockSize`). One option given twice with different values is refused.

use std::collections::HashMap;

use super::{FsType, ValidationError};

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FormatOptions {
    pub block_size: Option<u64>,
    pub inode_size: Option<u64>,
    pub bytes_per_inode: Option<u64>,
    pub number_of_inodes: Option<u64>,
    pub ext4_bigalloc: bool,
    pub ext4_cluster_size: Option<u64>,
    /// ext4's `encrypt` feature (fscrypt), upstream's `ext4EncryptionSupport`.
    pub ext4_encryption: bool,
}

/// The keys we read, in their documented spelling; lookups compare lowercase.
pub const KEYS: &[&str] = &[
    "blockSize",
    "inodeSize",
    "bytesPerInode",
    "numberOfInodes",
    "ext4BigAlloc",
    "ext4ClusterSize",
    "ext4EncryptionSupport",
];

/// The documented spelling of a format key, whatever its case in a request; `None`: not one.
pub fn key(raw: &str) -> Option<&'static str> {
    KEYS.iter().copied().find(|k| k.eq_ignore_ascii_case(raw))
}

/// The format keys present in `ctx`, by their documented spelling, whatever their case there.
fn format_keys(
    ctx: &HashMap<String, String>,
) -> Result<HashMap<&'static str, String>, ValidationError> {
    let mut found: HashMap<&'static str, String> = HashMap::new();
    for (key, value) in ctx {
        let Some(name) = self::key(key) else {
            continue;
        };
        if let Some(other) = found.insert(name, value.clone())
            && other != *value
        {
            return Err(ValidationError::bad(
                name,
                value.clone(),
                format!("the volume context also gives it as {other:?} (under another case)"),
            ));
        }
    }
    Ok(found)
}

fn number(
    key: &'static str,
    raw: &str,
    min: u64,
    max: u64,
    pow2: bool,
) -> Result<u64, ValidationError> {
    if raw.is_empty() || raw.len() > 12 || !raw.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ValidationError::bad(
            key,
            raw,
            "it must be a decimal number",
        ));
    }
    let n: u64 = raw
        .parse()
        .map_err(|_| ValidationError::bad(key, raw, "it must be a decimal number"))?;
    if n < min || n > max || (pow2 && !n.is_power_of_two()) {
        let shape = if pow2 { "a power of two " } else { "" };
        return Err(ValidationError::bad(
            key,
            raw,
            format!("it must be {shape}between {min} and {max}"),
        ));
    }
    Ok(n)
}

fn boolean(key: &'static str, raw: &str) -> Result<bool, ValidationError> {
    match raw {
        "true" => Ok(true),
        "false" | "" => Ok(false),
        other => Err(ValidationError::bad(key, other, "it must be true or false")),
    }
}

impl FormatOptions {
    pub fn parse(fs: FsType, ctx: &HashMap<String, String>) -> Result<Self, ValidationError> {
        let keys = format_keys(ctx)?;
        let mut o = FormatOptions::default();
        let only = |key: &'static str, allowed: bool| {
            if allowed {
                Ok(())
            } else {
                Err(ValidationError::bad(
                    key,
                    keys.get(key).cloned().unwrap_or_default(),
                    format!("this format option does not apply to {fs}"),
                ))
            }
        };
        if let Some(v) = keys.get("blockSize") {
            o.block_size = Some(if fs.is_ext() {
                number("blockSize", v, 1024, 65536, true)?
            } else {
                number("blockSize", v, 512, 65536, true)?
            });
        }
        if let Some(v) = keys.get("inodeSize") {
            o.inode_size = Some(if fs.is_ext() {
                number("inodeSize", v, 128, 4096, true)?
            } else {
                number("inodeSize", v, 256, 2048, true)?
            });
        }
        if let Some(v) = keys.get("bytesPerInode") {
            only("bytesPerInode", fs.is_ext())?;
            o.bytes_per_inode = Some(number("bytesPerInode", v, 1024, 1 << 26, false)?);
        }
        if let Some(v) = keys.get("numberOfInodes") {
            only("numberOfInodes", fs.is_ext())?;
            o.number_of_inodes = Some(number("numberOfInodes", v, 1, u64::from(u32::MAX), false)?);
        }
        if let Some(v) = keys.get("ext4BigAlloc") {
            only("ext4BigAlloc", fs == FsType::Ext4)?;
            o.ext4_bigalloc = boolean("ext4BigAlloc", v)?;
        }
        if let Some(v) = keys.get("ext4ClusterSize") {
            only("ext4ClusterSize", fs == FsType::Ext4)?;
            if !o.ext4_bigalloc {
                return Err(ValidationError::bad(
                    "ext4ClusterSize",
                    v.clone(),
                    "it needs ext4BigAlloc=true",
                ));
            }
            o.ext4_cluster_size = Some(number("ext4ClusterSize", v, 1024, 1 << 29, true)?);
        }
        if let Some(v) = keys.get("ext4EncryptionSupport") {
            only("ext4EncryptionSupport", fs == FsType::Ext4)?;
            o.ext4_encryption = boolean("ext4EncryptionSupport", v)?;
        }
        Ok(o)
    }

    /// mkfs arguments for these options (values are validated numbers, never free text).
    pub fn mkfs_args(&self, fs: FsType) -> Vec<String> {
        let mut args = Vec::new();
        if fs.is_ext() {
            if let Some(b) = self.block_size {
                args.extend(["-b".into(), b.to_string()]);
            }
            if let Some(i) = self.inode_size {
                args.extend(["-I".into(), i.to_string()]);
            }
            if let Some(i) = self.bytes_per_inode {
                args.extend(["-i".into(), i.to_string()]);
            }
            if let Some(n) = self.number_of_inodes {
                args.extend(["-N".into(), n.to_string()]);
            }
            let features: Vec<&str> = [
                (self.ext4_bigalloc, "bigalloc"),
                (self.ext4_encryption, "encrypt"),
            ]
            .iter()
            .filter_map(|(on, name)| on.then_some(*name))
            .collect();
            if !features.is_empty() {
                args.extend(["-O".into(), features.join(",")]);
            }
            if let Some(c) = self.ext4_cluster_size {
                args.extend(["-C".into(), c.to_string()]);
            }
        } else {
            if let Some(b) = self.block_size {
                args.extend(["-b".into(), format!("size={b}")]);
            }
            if let Some(i) = self.inode_size {
                args.extend(["-i".into(), format!("size={i}")]);
            }
        }
        args
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn ext4_options_become_args() {
        let o = FormatOptions::parse(
            FsType::Ext4,
            &ctx(&[
                ("blockSize", "4096"),
                ("ext4BigAlloc", "true"),
                ("ext4ClusterSize", "65536"),
            ]),
        )
        .unwrap();
        assert_eq!(
            o.mkfs_args(FsType::Ext4),
            ["-b", "4096", "-O", "bigalloc", "-C", "65536"]
        );
    }

    #[test]
    fn keys_in_any_case_and_encryption() {
        let lower = FormatOptions::parse(
            FsType::Ext4,
            &ctx(&[
                ("blocksize", "2048"),
                ("inodesize", "512"),
                ("bytesperinode", "8192"),
                ("numberofinodes", "4000"),
                ("ext4bigalloc", "true"),
                ("ext4clustersize", "32768"),
                ("ext4encryptionsupport", "true"),
            ]),
        )
        .unwrap();
        let camel = FormatOptions::parse(
            FsType::Ext4,
            &ctx(&[
                ("blockSize", "2048"),
                ("inodeSize", "512"),
                ("bytesPerInode", "8192"),
                ("numberOfInodes", "4000"),
                ("ext4BigAlloc", "true"),
                ("ext4ClusterSize", "32768"),
                ("ext4EncryptionSupport", "true"),
            ]),
        )
        .unwrap();
        assert_eq!(lower, camel);
        assert_eq!(
            lower.mkfs_args(FsType::Ext4),
            [
                "-b",
                "2048",
                "-I",
                "512",
                "-i",
                "8192",
                "-N",
                "4000",
                "-O",
                "bigalloc,encrypt",
                "-C",
                "32768"
            ]
        );
        // The same value twice is fine; two different ones are ambiguous.
        let same = ctx(&[("blockSize", "4096"), ("BLOCKSIZE", "4096")]);
        assert!(FormatOptions::parse(FsType::Xfs, &same).is_ok());
        let clash = ctx(&[("blockSize", "4096"), ("blocksize", "1024")]);
        assert!(FormatOptions::parse(FsType::Ext4, &clash).is_err());
        let xfs = ctx(&[("ext4encryptionsupport", "true")]);
        assert!(FormatOptions::parse(FsType::Xfs, &xfs).is_err());
    }

    #[test]
    fn refuses_bad_values() {
        for (k, v) in [
            ("blockSize", "4096; rm -rf /"),
            ("blockSize", "3000"),
            ("inodeSize", "$(id)"),
            ("bytesPerInode", "-1"),
            ("ext4BigAlloc", "yes"),
            ("numberOfInodes", ""),
        ] {
            assert!(
                FormatOptions::parse(FsType::Ext4, &ctx(&[(k, v)])).is_err(),
                "{k}={v}"
            );
        }
        assert!(FormatOptions::parse(FsType::Xfs, &ctx(&[("bytesPerInode", "4096")])).is_err());
        assert!(FormatOptions::parse(FsType::Ext3, &ctx(&[("ext4BigAlloc", "true")])).is_err());
        assert!(FormatOptions::parse(FsType::Ext4, &ctx(&[("ext4ClusterSize", "65536")])).is_err());
    }
}
