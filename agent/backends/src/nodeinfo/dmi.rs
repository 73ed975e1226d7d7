//! The instance id from DMI: Nitro instances put it in the board asset tag, readable without any
//! network call (so it works with IMDS off, hop-limited or blocked by a CNI).

use std::path::Path;

use ebs_node_core::ec2::{is_instance_id, is_instance_type};

pub const ASSET_TAG: &str = "devices/virtual/dmi/id/board_asset_tag";
pub const PRODUCT_NAME: &str = "devices/virtual/dmi/id/product_name";
pub const SYS_VENDOR: &str = "devices/virtual/dmi/id/sys_vendor";

/// `Ok(Some(id))` when the asset tag holds an instance id; `Ok(None)` when the file exists but
/// holds something else (Xen instances, other clouds, bare metal); `Err` says why it is unreadable.
pub fn instance_id(sysfs_root: &Path) -> Result<Option<String>, AssetTagUnreadable> {
    let path = sysfs_root.join(ASSET_TAG);
    match std::fs::read_to_string(&path) {
        Ok(raw) => {
            let tag = raw.trim();
            Ok(is_instance_id(tag).then(|| tag.to_string()))
        }
        Err(source) => Err(AssetTagUnreadable { path, source }),
    }
}

/// The board asset tag could not be read.
#[derive(Debug, thiserror::Error)]
#[error("{}: {source}", .path.display())]
pub struct AssetTagUnreadable {
    pub path: std::path::PathBuf,
    pub source: std::io::Error,
}

/// The instance type: Nitro instances (vendor `Amazon EC2`) name it in the product name, which
/// gives the attach limit without instance metadata. `None` elsewhere (Xen says `HVM domU`).
pub fn instance_type(sysfs_root: &Path) -> Option<String> {
    let read = |rel: &str| std::fs::read_to_string(sysfs_root.join(rel)).ok();
    if read(SYS_VENDOR)?.trim() != "Amazon EC2" {
        return None;
    }
    let name = read(PRODUCT_NAME)?.trim().to_string();
    is_instance_type(&name).then_some(name)
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
            instance_id(&f.0).unwrap(),
            Some("i-0123456789abcdef0".to_string())
        );
    }

    #[test]
    fn ignores_other_tags_and_reports_missing_files() {
        let f = Fixture::new("xen", Some("Not Specified\n"));
        assert_eq!(instance_id(&f.0).unwrap(), None);
        let f = Fixture::new("none", None);
        assert!(
            instance_id(&f.0)
                .unwrap_err()
                .to_string()
                .contains("board_asset_tag")
        );
    }

    #[test]
    fn instance_type_from_a_nitro_product_name() {
        let f = Fixture::new("type", None);
        let write = |rel: &str, v: &str| {
            let file = f.0.join(rel);
            std::fs::create_dir_all(file.parent().unwrap()).unwrap();
            std::fs::write(file, v).unwrap();
        };
        write(PRODUCT_NAME, "m7i.large\n");
        assert_eq!(instance_type(&f.0), None, "no vendor: not trusted");
        write(SYS_VENDOR, "Amazon EC2\n");
        assert_eq!(instance_type(&f.0).as_deref(), Some("m7i.large"));
        write(PRODUCT_NAME, "HVM domU\n");
        assert_eq!(instance_type(&f.0), None);
    }
}
