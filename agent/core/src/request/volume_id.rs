//! Volume ids as node calls carry them: an opaque id (`vol-…`, a loop volume's id), or a
//! node-local handle `local-ebs://<device>` (upstream aws-ebs-csi-driver v1.53+,
//! `docs/node-local-volumes.md`): a disk pre-attached to every node at the same device name,
//! written without its leading slash (`local-ebs://dev/xvdbz` is `/dev/xvdbz`).
//!
//! The raw string is the journal's key (unique per volume: an opaque id never contains '/', a
//! handle always does). Wherever the agent makes a path from an id (v0.1 staging directories),
//! it uses `file_name()`, which is one path component for both kinds and never the same for two
//! ids: opaque ids may not start with `local-ebs:`, handles become `local-ebs:` + the device's
//! components joined by ':', which no component may contain.

use std::path::{Path, PathBuf};

use super::{MAX_STRING_BYTES, ValidationError};

/// The prefix of node-local handles, as upstream spells it.
pub const LOCAL_EBS_PREFIX: &str = "local-ebs://";
/// What no opaque id may start with: the scheme of a handle, well formed or not, and the start
/// of a handle's file name.
const LOCAL_EBS_SCHEME: &str = "local-ebs:";

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VolumeId {
    raw: String,
    /// For a node-local handle: the device it names (`/dev/…`), checked lexically.
    local: Option<PathBuf>,
}

impl VolumeId {
    pub fn parse(raw: &str) -> Result<Self, ValidationError> {
        const FIELD: &str = "volume_id";
        if raw.is_empty() {
            return Err(ValidationError::Missing(FIELD));
        }
        if raw.len() > MAX_STRING_BYTES {
            return Err(ValidationError::TooLong {
                field: FIELD,
                max: MAX_STRING_BYTES,
            });
        }
        if raw.starts_with(LOCAL_EBS_SCHEME) {
            let device = local_device(raw).map_err(|why| ValidationError::bad(FIELD, raw, why))?;
            return Ok(VolumeId {
                raw: raw.to_string(),
                local: Some(device),
            });
        }
        if raw.chars().any(|c| c == '/' || c.is_control()) {
            return Err(ValidationError::bad(
                FIELD,
                raw,
                "it must not contain '/' or control characters",
            ));
        }
        Ok(VolumeId {
            raw: raw.to_string(),
            local: None,
        })
    }

    pub fn as_str(&self) -> &str {
        &self.raw
    }

    /// The device a node-local handle names; `None` for an opaque id.
    pub fn local_device(&self) -> Option<&Path> {
        self.local.as_deref()
    }

    pub fn is_local(&self) -> bool {
        self.local.is_some()
    }

    /// One path component that stands for this id, distinct for distinct ids (see the module
    /// comment). `.` and `..` are opaque ids that no path may be made of: `None`.
    pub fn file_name(&self) -> Option<String> {
        match &self.local {
            Some(_) => {
                let rest = &self.raw[LOCAL_EBS_PREFIX.len()..];
                Some(format!("{LOCAL_EBS_SCHEME}{}", rest.replace('/', ":")))
            }
            None if matches!(self.raw.as_str(), "." | "..") => None,
            None => Some(self.raw.clone()),
        }
    }
}

/// The device of a `local-ebs://` handle: below `/dev`, made only of plain components of
/// `[A-Za-z0-9._+-]` (no empty, `.` or `..` component), so it can neither climb out of `/dev`
/// nor be spelled two ways.
fn local_device(raw: &str) -> Result<PathBuf, String> {
    const FORM: &str = "a node-local handle is local-ebs://dev/<name> (the device path without \
                        its leading slash, e.g. local-ebs://dev/xvdbz)";
    let Some(rest) = raw.strip_prefix(LOCAL_EBS_PREFIX) else {
        return Err(FORM.into());
    };
    let parts: Vec<&str> = rest.split('/').collect();
    let plain = |p: &&str| {
        !p.is_empty()
            && *p != "."
            && *p != ".."
            && p.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'+' | b'-'))
    };
    if parts.len() < 2 || parts[0] != "dev" || !parts.iter().all(plain) {
        return Err(FORM.into());
    }
    Ok(Path::new("/").join(rest))
}

impl std::fmt::Display for VolumeId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.raw)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opaque_ids() {
        assert!(VolumeId::parse("vol-0123456789abcdef0").is_ok());
        assert!(VolumeId::parse("").is_err());
        assert!(VolumeId::parse("a/b").is_err());
        assert!(VolumeId::parse("a\0b").is_err());
        assert!(VolumeId::parse(&"x".repeat(129)).is_err());
        assert_eq!(VolumeId::parse("..").expect("id").file_name(), None);
    }

    #[test]
    fn node_local_handles() {
        let id = VolumeId::parse("local-ebs://dev/xvdbz").expect("handle");
        assert_eq!(id.local_device(), Some(Path::new("/dev/xvdbz")));
        assert_eq!(id.file_name().as_deref(), Some("local-ebs:dev:xvdbz"));
        let nested = VolumeId::parse("local-ebs://dev/disk/by-id/nvme-x_1").expect("handle");
        assert_eq!(
            nested.local_device(),
            Some(Path::new("/dev/disk/by-id/nvme-x_1"))
        );
        for bad in [
            "local-ebs://",
            "local-ebs://dev",
            "local-ebs://dev/",
            "local-ebs:///dev/xvdbz",
            "local-ebs://../x",
            "local-ebs://dev/../etc/passwd",
            "local-ebs://dev/./xvdbz",
            "local-ebs://dev//xvdbz",
            "local-ebs://etc/passwd",
            "local-ebs://dev/xvd:bz",
            "local-ebs://dev/xvd bz",
            "local-ebs://dev/x\u{1b}",
            "local-ebs:dev:xvdbz",
            "local-ebs:",
        ] {
            assert!(VolumeId::parse(bad).is_err(), "{bad:?} was accepted");
        }
    }

    /// No two ids share a file name: opaque ids never start with the handles' scheme.
    #[test]
    fn file_names_are_distinct() {
        let ids = [
            "local-ebs://dev/a/b",
            "local-ebs://dev/a-b",
            "local-ebs://dev/a.b",
            "vol-1",
            "local-ebs",
        ];
        let names: std::collections::HashSet<_> = ids
            .iter()
            .map(|i| VolumeId::parse(i).expect("id").file_name().expect("name"))
            .collect();
        assert_eq!(names.len(), ids.len());
        for n in &names {
            assert!(!n.contains('/') && n != "." && n != "..");
        }
    }
}
