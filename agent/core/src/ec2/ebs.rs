//! EBS volumes as the host names them: the NVMe controller's serial (`vol0123…`, which sysfs
//! shows padded), the disk names of native NVMe multipath, and the `partition` volume-context
//! key.

use std::collections::HashMap;

use crate::request::{ValidationError, VolumeId};

/// The model string of an EBS volume's NVMe controller.
pub const EBS_MODEL: &str = "Amazon Elastic Block Store";
/// The model string of an instance-store NVMe disk.
pub const INSTANCE_STORE_MODEL: &str = "Amazon EC2 NVMe Instance Storage";

/// Trims the space and NUL padding NVMe identify strings carry; an empty attribute counts as
/// absent.
pub fn clean(text: &str) -> Option<String> {
    let t = text.trim_matches(|c: char| c.is_whitespace() || c == '\0');
    (!t.is_empty()).then(|| t.to_string())
}

/// The serial an EBS volume's controller reports: `vol-0123…` becomes `vol0123…`. `None` when the
/// id is not an EBS volume id (`vol-` and hex digits): the serial is derived, never parsed
/// loosely.
pub fn serial_of(volume: &VolumeId) -> Option<String> {
    match volume.as_str().strip_prefix("vol-") {
        Some(hex) if !hex.is_empty() && hex.bytes().all(|b| b.is_ascii_hexdigit()) => {
            Some(format!("vol{hex}"))
        }
        _ => None,
    }
}

/// EBS serials appear as `vol0123…` in sysfs and `vol-0123…` in volume ids: the form both
/// compare in (no dash, lowercase).
pub fn normalize_serial(s: &str) -> String {
    s.trim().replace('-', "").to_ascii_lowercase()
}

/// Whether a disk name is a hidden per-path node of native NVMe multipath,
/// `nvme<subsys>c<ctrl>n<ns>`: kernels without the `hidden` attribute still name them so.
pub fn is_multipath_path_name(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("nvme") else {
        return false;
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    match rest.split_once('c') {
        Some((a, b)) => {
            digits(a)
                && b.split_once('n')
                    .is_some_and(|(c, n)| digits(c) && digits(n))
        }
        None => false,
    }
}

/// The `partition` volume-context key: absent, empty or `0` mean the whole disk; otherwise a
/// GPT partition number, 1 to 128.
pub fn partition_of(
    volume_context: &HashMap<String, String>,
) -> Result<Option<u32>, ValidationError> {
    let Some(raw) = volume_context.get("partition") else {
        return Ok(None);
    };
    match raw.parse::<u32>() {
        _ if raw.is_empty() => Ok(None),
        Ok(0) => Ok(None),
        Ok(n) if n <= 128 => Ok(Some(n)),
        _ => Err(ValidationError::bad(
            "volume_context partition",
            raw.as_str(),
            "a partition number from 1 to 128 (0 or empty: the whole disk)",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vol(id: &str) -> VolumeId {
        VolumeId::parse(id).expect("a valid volume id")
    }

    #[test]
    fn serials_are_derived_from_ebs_ids_only() {
        assert_eq!(
            serial_of(&vol("vol-0123456789abcdef0")).as_deref(),
            Some("vol0123456789abcdef0")
        );
        for bad in ["vol-", "vol-xyz", "volume-01", "pvc-123", "vol0123"] {
            assert_eq!(serial_of(&vol(bad)), None, "{bad}");
        }
        assert_eq!(
            normalize_serial(" VOL-0123ABC "),
            normalize_serial("vol0123abc")
        );
    }

    #[test]
    fn identify_strings_lose_their_padding() {
        assert_eq!(clean("vol0123  \0\0").as_deref(), Some("vol0123"));
        assert_eq!(clean(" \0 \n"), None);
    }

    #[test]
    fn multipath_path_names() {
        assert!(is_multipath_path_name("nvme0c0n1"));
        assert!(is_multipath_path_name("nvme12c3n45"));
        for name in [
            "nvme0n1",
            "nvme0c0n",
            "nvmec0n1",
            "nvme0cxn1",
            "sda",
            "nvme0n1p1",
        ] {
            assert!(!is_multipath_path_name(name), "{name}");
        }
    }

    #[test]
    fn partitions() {
        let ctx = |v: &str| HashMap::from([("partition".to_string(), v.to_string())]);
        assert_eq!(partition_of(&HashMap::new()), Ok(None));
        assert_eq!(partition_of(&ctx("")), Ok(None));
        assert_eq!(partition_of(&ctx("0")), Ok(None));
        assert_eq!(partition_of(&ctx("1")), Ok(Some(1)));
        assert_eq!(partition_of(&ctx("128")), Ok(Some(128)));
        for bad in ["129", "-1", "one", " 1", "4294967296"] {
            assert!(partition_of(&ctx(bad)).is_err(), "{bad}");
        }
    }
}
