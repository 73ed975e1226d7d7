use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// Root-only tests skip when unprivileged, except in CI where a skip
/// would hide a broken environment.
pub fn root_or_skip(test: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{test}: requires root, and CI=true forbids skipping");
    }
    skip(test, "requires root");
    false
}

/// As `ebs_tests::skip`: cargo shows a skipped test as "ok", so the skip is printed and added
/// to `$EBS_SKIP_LOG`, which `tests/run.sh` lists in its summary.
pub fn skip(test: &str, reason: &str) {
    let line = format!("SKIPPED: {test}: {reason}\n");
    eprint!("{line}");
    if let Some(log) = std::env::var_os("EBS_SKIP_LOG") {
        use std::io::Write;
        let _ = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .and_then(|mut f| f.write_all(line.as_bytes()));
    }
}

/// A sparse file removed on drop, even when the test panics.
pub struct TempFile(pub PathBuf);

impl TempFile {
    pub fn sparse(tag: &str, size: u64) -> TempFile {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let path = std::env::temp_dir().join(format!(
            "hosttest-{tag}-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(size).unwrap();
        TempFile(path)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A directory removed (with its contents) on drop, even when the test panics.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let path = std::env::temp_dir().join(format!(
            "hosttest-{tag}-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A loop device detached on drop. Declare it after its `TempFile` so it
/// is dropped first. It detaches only while the device is still bound to the
/// file it attached: once detached, the device number is free, and a test
/// running in parallel may already have attached its own file to it.
pub struct Loop(pub PathBuf, Option<(u64, u64)>);

impl Loop {
    pub fn attach(file: &Path) -> Loop {
        Loop::bound(super::attach(file).unwrap())
    }

    /// Guards a device that was just attached.
    pub fn bound(device: PathBuf) -> Loop {
        let backing = super::backing_inode(&device).ok().flatten();
        Loop(device, backing)
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        if self.1.is_none() || super::backing_inode(&self.0).ok().flatten() != self.1 {
            return;
        }
        if let Err(e) = super::detach(&self.0) {
            eprintln!("cleanup: detach {:?} failed: {e}", self.0);
        }
    }
}

pub fn sh(script: &str) {
    let out = std::process::Command::new("sh")
        .args(["-c", script])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "`{script}` failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
