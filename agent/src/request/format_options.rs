//! Format options from volume_context (the EBS driver's keys). Their values reach mkfs's argument
//! list, so each is parsed as a number or boolean, range-checked, and allowed only for the
//! filesystems that have it.

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
        let mut o = FormatOptions::default();
        let only = |key: &'static str, allowed: bool, fs: FsType| {
            if allowed {
                Ok(())
            } else {
                Err(ValidationError::bad(
                    key,
                    ctx.get(key).cloned().unwrap_or_default(),
                    format!("this format option does not apply to {fs}"),
                ))
            }
        };
        if let Some(v) = ctx.get("blockSize") {
            o.block_size = Some(if fs.is_ext() {
                number("blockSize", v, 1024, 65536, true)?
            } else {
                number("blockSize", v, 512, 65536, true)?
            });
        }
        if let Some(v) = ctx.get("inodeSize") {
            o.inode_size = Some(if fs.is_ext() {
                number("inodeSize", v, 128, 4096, true)?
            } else {
                number("inodeSize", v, 256, 2048, true)?
            });
        }
        if let Some(v) = ctx.get("bytesPerInode") {
            only("bytesPerInode", fs.is_ext(), fs)?;
            o.bytes_per_inode = Some(number("bytesPerInode", v, 1024, 1 << 26, false)?);
        }
        if let Some(v) = ctx.get("numberOfInodes") {
            only("numberOfInodes", fs.is_ext(), fs)?;
            o.number_of_inodes = Some(number("numberOfInodes", v, 1, u32::MAX as u64, false)?);
        }
        if let Some(v) = ctx.get("ext4BigAlloc") {
            only("ext4BigAlloc", fs == FsType::Ext4, fs)?;
            o.ext4_bigalloc = boolean("ext4BigAlloc", v)?;
        }
        if let Some(v) = ctx.get("ext4ClusterSize") {
            only("ext4ClusterSize", fs == FsType::Ext4, fs)?;
            if !o.ext4_bigalloc {
                return Err(ValidationError::bad(
                    "ext4ClusterSize",
                    v.clone(),
                    "it needs ext4BigAlloc=true",
                ));
            }
            o.ext4_cluster_size = Some(number("ext4ClusterSize", v, 1024, 1 << 29, true)?);
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
            if self.ext4_bigalloc {
                args.extend(["-O".into(), "bigalloc".into()]);
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
