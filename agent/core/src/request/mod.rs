//! Typed, validated commands. A raw CSI request becomes one of these at the gRPC door; domain code
//! never sees an unchecked string, path or flag.

mod capability;
mod format_options;
mod mount_flags;
mod paths;
mod volume_id;

use std::collections::HashMap;
use std::path::PathBuf;

pub use capability::{
    AccessMode, AccessType, Capability, FsType, RawAccess, RawCapability, csi_mode,
};
pub use format_options::FormatOptions;
/// The format options' keys (`KEYS`) and their spelling (`key`), for whoever passes them on.
pub mod format_keys {
    pub use super::format_options::{KEYS, key};
}
pub use mount_flags::{MountFlags, ms};
pub use paths::{MAX_PATH_BYTES, RequestPath, Roots, parse_prefix};
pub use volume_id::{LOCAL_EBS_PREFIX, VolumeId};

/// CSI's limit for string fields.
pub const MAX_STRING_BYTES: usize = 128;
/// CSI's limit for a whole map<string,string> field.
pub const MAX_MAP_BYTES: usize = 4096;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ValidationError {
    #[error("{0} is required")]
    Missing(&'static str),
    #[error("{field} is longer than {max} bytes")]
    TooLong { field: &'static str, max: usize },
    #[error("{field} {value:?} is invalid: {why}")]
    BadValue {
        field: &'static str,
        value: String,
        why: String,
    },
    #[error("{field} {path:?} is refused: {why}")]
    BadPath {
        field: &'static str,
        path: PathBuf,
        why: &'static str,
    },
    #[error("{field} {path:?} is outside the allowed path prefixes (see --allowed-path-prefix)")]
    OutsideAllowedRoots { field: &'static str, path: PathBuf },
    /// The request is well formed but asks for something this plugin cannot provide: CSI wants
    /// FAILED_PRECONDITION here, not INVALID_ARGUMENT.
    #[error("{0}")]
    Unsupported(String),
}

impl ValidationError {
    pub fn bad(field: &'static str, value: impl Into<String>, why: impl Into<String>) -> Self {
        ValidationError::BadValue {
            field,
            value: value.into(),
            why: why.into(),
        }
    }
}

/// Checks CSI's size limit on a map field (keys and values together).
pub fn check_map(
    field: &'static str,
    map: &HashMap<String, String>,
) -> Result<(), ValidationError> {
    let size: usize = map.iter().map(|(k, v)| k.len() + v.len()).sum();
    if size > MAX_MAP_BYTES {
        return Err(ValidationError::TooLong {
            field,
            max: MAX_MAP_BYTES,
        });
    }
    Ok(())
}

/// Secrets from requests: carried, never printed.
#[derive(Clone, Default)]
pub struct Secrets(#[allow(dead_code)] HashMap<String, String>);

impl Secrets {
    pub fn new(map: HashMap<String, String>) -> Self {
        Secrets(map)
    }
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secrets(<{} redacted>)", self.0.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_do_not_print() {
        let s = Secrets::new(HashMap::from([("key".into(), "hunter2".into())]));
        assert!(!format!("{s:?}").contains("hunter2"));
    }
}
