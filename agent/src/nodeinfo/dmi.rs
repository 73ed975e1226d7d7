//! The instance id from DMI: Nitro instances put it in the board asset tag, readable without any
//! network call (so it works with IMDS off, hop-limited or blocked by a CNI).

use std::path::Path;

pub const ASSET_TAG: &str = "devices/virtual/dmi/id/board_asset_tag";

/// `Ok(Some(id))` when the asset tag holds an instance id; `Ok(None)` when the file exists but
/// holds something else (Xen instances, other clouds, bare metal); `Err` says why it is unreadable.
pub fn instance_id(sysfs_root: &Path) -> Result<Option<String>, String> {
    let path = sysfs_root.join(ASSET_TAG);
    match std::fs::read_to_string(&path) {
        Ok(raw) => {
            let tag = raw.trim();
            Ok(is_instance_id(tag).then(|| tag.to_string()))
        }
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// `i-` and 8 or 17 lowercase hex digits, the two forms EC2 has issued.
pub fn is_instance_id(s: &str) -> bool {
    s.strip_prefix("i-").is_some_and(|hex| {
        (hex.len() == 8 || hex.len() == 17)
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixture(std::path::PathBuf);
    impl Fixture {
        fn new(name: &str, tag: Option<&str>) -> Self {
            let root = std::env::temp_dir().join(format!("dmi-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&root);
            if let Some(tag) = tag {
                let file = root.join(ASSET_TAG);
                std::fs::create_dir_all(file.parent().unwrap()).unwrap();
                std::fs::write(file, tag).unwrap();
            } else {
                std::fs::create_dir_all(&root).unwrap();
            }
            Fixture(root)
        }
    }
    impl Drop for Fixture {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn reads_a_nitro_asset_tag() {
        let f = Fixture::new("nitro", Some("i-0123456789abcdef0\n"));
        assert_eq!(
            instance_id(&f.0),
            Ok(Some("i-0123456789abcdef0".to_string()))
        );
    }

    #[test]
    fn ignores_other_tags_and_reports_missing_files() {
        let f = Fixture::new("xen", Some("Not Specified\n"));
        assert_eq!(instance_id(&f.0), Ok(None));
        let f = Fixture::new("none", None);
        assert!(instance_id(&f.0).unwrap_err().contains("board_asset_tag"));
    }

    #[test]
    fn instance_id_forms() {
        assert!(is_instance_id("i-12345678"));
        assert!(is_instance_id("i-0123456789abcdef0"));
        assert!(!is_instance_id("i-0123456789ABCDEF0"));
        assert!(!is_instance_id("i-123"));
        assert!(!is_instance_id("vol-0123456789abcdef0"));
    }
}
