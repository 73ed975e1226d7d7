//! A fake sysfs + /dev tree with the kernel's NVMe layouts, for tests and benches: NVMe devices
//! cannot exist on the build machine, their sysfs shape can. Regular files stand in for device
//! nodes unless a test links a real block device there.

use std::io;
use std::path::{Path, PathBuf};

pub struct Fixture {
    root: PathBuf,
    owned: bool,
}

fn pad40(s: &str) -> String {
    format!("{s:<40}\n")
}

fn symlink(target: impl AsRef<Path>, link: impl AsRef<Path>) -> io::Result<()> {
    let link = link.as_ref();
    if link.symlink_metadata().is_ok() {
        std::fs::remove_file(link)?;
    }
    std::os::unix::fs::symlink(target, link)
}

impl Fixture {
    /// A tree under the system temp directory, removed on drop.
    pub fn temp(name: &str) -> io::Result<Self> {
        let root = std::env::temp_dir().join(format!("ebs-fixture-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let mut f = Self::at(&root)?;
        f.owned = true;
        Ok(f)
    }

    /// A tree at `root`, left in place (the caller owns the directory).
    pub fn at(root: &Path) -> io::Result<Self> {
        for d in [
            "sys/block",
            "sys/devices/virtual/nvme-subsystem",
            "dev/disk/by-id",
        ] {
            std::fs::create_dir_all(root.join(d))?;
        }
        Ok(Fixture {
            root: root.to_path_buf(),
            owned: false,
        })
    }

    pub fn sys_root(&self) -> PathBuf {
        self.root.join("sys")
    }

    pub fn dev_root(&self) -> PathBuf {
        self.root.join("dev")
    }

    fn pci_controller(&self, ctrl: u32) -> PathBuf {
        self.sys_root().join(format!(
            "devices/pci0000:00/0000:00:{:02x}.0/nvme/nvme{ctrl}",
            ctrl + 4
        ))
    }

    /// Writes a controller's identify attributes; `None` leaves `serial` out.
    fn controller_attrs(dir: &Path, serial: Option<&str>, model: &str) -> io::Result<()> {
        std::fs::create_dir_all(dir)?;
        if let Some(s) = serial {
            std::fs::write(dir.join("serial"), pad40(s))?;
        }
        std::fs::write(dir.join("model"), pad40(model))?;
        std::fs::write(dir.join("rescan_controller"), "")
    }

    /// A namespace directory with `dev`, `nsid` and a `device` link; published in
    /// `/sys/block` last, so a scanning reader never sees half of it.
    fn namespace(
        &self,
        dir: &Path,
        device: &Path,
        name: &str,
        ns: u32,
        minor: u32,
    ) -> io::Result<()> {
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join("dev"), format!("259:{minor}\n"))?;
        std::fs::write(dir.join("nsid"), format!("{ns}\n"))?;
        symlink(device, dir.join("device"))?;
        std::fs::write(self.dev_root().join(name), b"")?;
        symlink(dir, self.sys_root().join("block").join(name))
    }

    /// A plain NVMe controller `nvme<ctrl>` with namespaces `nvme<ctrl>n<ns>` (EBS's layout).
    pub fn nvme(
        &self,
        ctrl: u32,
        serial: Option<&str>,
        model: &str,
        namespaces: &[u32],
    ) -> io::Result<Vec<String>> {
        let c = self.pci_controller(ctrl);
        Self::controller_attrs(&c, serial, model)?;
        let mut names = Vec::new();
        for &ns in namespaces {
            let name = format!("nvme{ctrl}n{ns}");
            self.namespace(&c.join(&name), &c, &name, ns, ctrl * 16 + ns)?;
            names.push(name);
        }
        Ok(names)
    }

    /// Native NVMe multipath: the visible head `nvme<subsys>n<ns>` lives under the subsystem,
    /// whose attributes repeat the controller's; the per-path `nvme<subsys>c<ctrl>n<ns>` is hidden.
    pub fn nvme_multipath(
        &self,
        subsys: u32,
        ctrl: u32,
        serial: &str,
        model: &str,
        ns: u32,
    ) -> io::Result<String> {
        let c = self.pci_controller(ctrl);
        Self::controller_attrs(&c, Some(serial), model)?;
        let s = self.sys_root().join(format!(
            "devices/virtual/nvme-subsystem/nvme-subsys{subsys}"
        ));
        std::fs::create_dir_all(&s)?;
        std::fs::write(s.join("serial"), pad40(serial))?;
        std::fs::write(s.join("model"), pad40(model))?;
        symlink(&c, s.join(format!("nvme{ctrl}")))?;
        let hidden = format!("nvme{subsys}c{ctrl}n{ns}");
        let hdir = c.join(&hidden);
        std::fs::create_dir_all(&hdir)?;
        std::fs::write(hdir.join("dev"), format!("259:{}\n", 200 + ctrl * 16 + ns))?;
        std::fs::write(hdir.join("hidden"), "1\n")?;
        symlink(&c, hdir.join("device"))?;
        symlink(&hdir, self.sys_root().join("block").join(&hidden))?;
        let head = format!("nvme{subsys}n{ns}");
        self.namespace(&s.join(&head), &s, &head, ns, 100 + subsys * 16 + ns)?;
        Ok(head)
    }

    /// A Xen block device: a disk with no NVMe controller behind it.
    pub fn xen(&self, name: &str, minor: u32) -> io::Result<()> {
        let v = self.sys_root().join(format!("devices/vbd-{minor}"));
        let dir = v.join("block").join(name);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("dev"), format!("202:{minor}\n"))?;
        symlink(&v, dir.join("device"))?;
        std::fs::write(self.dev_root().join(name), b"")?;
        symlink(&dir, self.sys_root().join("block").join(name))
    }

    /// Partition `number` of `disk`, named as the kernel names it.
    pub fn partition(&self, disk: &str, number: u32) -> io::Result<String> {
        let dir = std::fs::canonicalize(self.sys_root().join("block").join(disk))?;
        let sep = if disk.ends_with(|c: char| c.is_ascii_digit()) {
            "p"
        } else {
            ""
        };
        let name = format!("{disk}{sep}{number}");
        let p = dir.join(&name);
        std::fs::create_dir_all(&p)?;
        std::fs::write(p.join("partition"), format!("{number}\n"))?;
        std::fs::write(p.join("dev"), format!("259:{}\n", 500 + number))?;
        std::fs::write(self.dev_root().join(&name), b"")?;
        Ok(name)
    }

    /// Overrides a disk's major:minor (tests point a fixture disk at a real loop device).
    pub fn set_dev(&self, disk: &str, major: u32, minor: u32) -> io::Result<()> {
        let dir = self.sys_root().join("block").join(disk);
        std::fs::write(dir.join("dev"), format!("{major}:{minor}\n"))
    }

    /// A link under the dev root (`xvdba`, `disk/by-id/...`) to `target` (absolute or relative).
    pub fn link(&self, rel: &str, target: impl AsRef<Path>) -> io::Result<PathBuf> {
        let link = self.dev_root().join(rel);
        if let Some(parent) = link.parent() {
            std::fs::create_dir_all(parent)?;
        }
        symlink(target, &link)?;
        Ok(link)
    }

    /// Removes a disk from `/sys/block` and its node (a detach).
    pub fn remove(&self, disk: &str) -> io::Result<()> {
        std::fs::remove_file(self.sys_root().join("block").join(disk))?;
        let _ = std::fs::remove_file(self.dev_root().join(disk));
        Ok(())
    }

    /// Replaces a controller's serial (the device under a name changed).
    pub fn set_serial(&self, ctrl: u32, serial: &str) -> io::Result<()> {
        std::fs::write(self.pci_controller(ctrl).join("serial"), pad40(serial))
    }

    pub fn rescan_requested(&self, ctrl: u32) -> bool {
        std::fs::read_to_string(self.pci_controller(ctrl).join("rescan_controller"))
            .is_ok_and(|s| s.trim() == "1")
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if self.owned {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}
