//! Shared helpers for the integration tests: start the real `ebs-node-agent` binary on a real
//! socket, talk CSI to it, and leave the host clean even when a test fails (Drop guards unmount,
//! detach loop devices and remove temp files).

pub mod addons;
mod agent;
pub mod apiserver;
pub mod controller_cases;
pub mod crash_points;
pub mod csi_req;
pub mod elsewhere;
pub mod fake_controller;
pub mod http;
pub mod hung_mount;
pub mod imds;
pub mod k8s;
pub mod lab;
pub mod legacy;
pub mod log_writes;
pub mod seccomp;
pub mod tools;

pub use agent::{Agent, AgentOpts, channel};

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

pub use ebs_proto::csi::v1 as csi;

/// The agent binary: `$EBS_AGENT_BIN`, or the one cargo built next to this test executable.
pub fn agent_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("EBS_AGENT_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("current_exe");
    // target/debug/deps/<test> → target/debug/ebs-node-agent
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let bin = dir.join("ebs-node-agent");
    assert!(
        bin.exists(),
        "{} is missing: build it first (cargo build --workspace --bins)",
        bin.display()
    );
    bin
}

pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Root-only tests call this first: outside root they skip, but under CI=true they must run.
pub fn require_root(test: &str) -> bool {
    if is_root() {
        return true;
    }
    if is_ci() {
        panic!("{test} needs root and CI=true: refusing to skip");
    }
    skip(test, "needs root");
    false
}

/// CI=true: nothing may skip there.
pub fn is_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// A test that returns early without checking anything says so out loud: cargo shows it as
/// "ok", so the line also goes to `$EBS_SKIP_LOG`, which `tests/run.sh` prints in its summary.
pub fn skip(test: &str, reason: &str) {
    let line = format!("SKIPPED: {test}: {reason}\n");
    eprint!("{line}");
    if let Some(log) = std::env::var_os("EBS_SKIP_LOG") {
        use std::io::Write;
        // One append-mode write per line: parallel tests never interleave within a line.
        let _ = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .and_then(|mut f| f.write_all(line.as_bytes()));
    }
}

/// A scratch directory that, when dropped, unmounts everything below it, detaches loop devices
/// backed by files below it, and removes it.
pub struct Scratch {
    pub path: PathBuf,
}

impl Scratch {
    pub fn new(name: &str) -> Self {
        let path = std::env::temp_dir().join(format!("ebs-it-{name}-{}", std::process::id()));
        cleanup_dir(&path);
        std::fs::create_dir_all(&path).expect("create scratch");
        Scratch { path }
    }

    pub fn join(&self, p: &str) -> PathBuf {
        self.path.join(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        cleanup_dir(&self.path);
    }
}

fn decode_mountinfo_path(raw: &str) -> PathBuf {
    let mut out = Vec::new();
    let b = raw.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && let Ok(v) = u8::from_str_radix(&raw[i + 1..i + 4], 8)
        {
            out.push(v);
            i += 4;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    PathBuf::from(std::ffi::OsString::from(
        String::from_utf8_lossy(&out).into_owned(),
    ))
}

/// A shell line that, run first thing in a new mount namespace, lazily unmounts its copies of
/// the other tests' mounts (everything below the tests' scratch prefix but `keep`): a copy would
/// keep their devices claimed, and a parallel test's unstage would be rightly refused as "still
/// mounted elsewhere".
pub fn drop_other_tests_mounts(keep: &Path) -> String {
    format!(
        "awk '{{print $5}}' /proc/self/mountinfo | grep '^{tests}' | grep -v '^{keep}' | \
         sort -r | while read -r m; do umount -l \"$m\" 2>/dev/null; done",
        tests = std::env::temp_dir().join("ebs-it-").display(),
        keep = keep.display(),
    )
}

/// Mount points at or below `dir`, deepest (latest) first.
pub fn mounts_below(dir: &Path) -> Vec<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut out: Vec<PathBuf> = text
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(decode_mountinfo_path)
        .filter(|p| p.starts_with(dir))
        .collect();
    out.reverse();
    out
}

/// Loop devices whose backing file lies below `dir`, after the loop devices laid over them (a
/// read-only block publication's, which a test that failed midway leaves behind): those go first.
pub fn loops_below(dir: &Path) -> Vec<PathBuf> {
    let mut backed: Vec<(PathBuf, PathBuf)> = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/sys/block") {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !name.starts_with("loop") {
                continue;
            }
            if let Ok(b) = std::fs::read_to_string(e.path().join("loop/backing_file")) {
                let backing = PathBuf::from(b.trim().trim_end_matches(" (deleted)"));
                backed.push((PathBuf::from("/dev").join(&name), backing));
            }
        }
    }
    let ours: Vec<PathBuf> = backed
        .iter()
        .filter(|(_, b)| b.starts_with(dir))
        .map(|(d, _)| d.clone())
        .collect();
    let mut out: Vec<PathBuf> = backed
        .iter()
        .filter(|(_, b)| ours.contains(b))
        .map(|(d, _)| d.clone())
        .collect();
    out.extend(ours);
    out
}

pub fn cleanup_dir(dir: &Path) {
    // Loops first: once a filesystem below `dir` is lazily unmounted, a loop file on it shows a
    // path relative to that detached mount, and would keep it (and its own loop) alive. Each
    // device is checked again right before it is detached: one the agent already freed may have
    // been taken by another test in the meantime, and must not be pulled from under it.
    detach_loops_below(dir);
    for m in mounts_below(dir) {
        let _ = nix::mount::umount2(&m, nix::mount::MntFlags::MNT_DETACH);
    }
    detach_loops_below(dir);
    let _ = std::fs::remove_dir_all(dir);
}

fn detach_loops_below(dir: &Path) {
    for dev in loops_below(dir) {
        let name = dev
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let still_ours = std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file"))
            .is_ok_and(|b| {
                let backing = b.trim().trim_end_matches(" (deleted)");
                // A string's prefix: `Path::starts_with` compares whole components, and
                // "/dev/loop1" does not start with the component "loop" (the read-only devices
                // laid over a test's loop devices were left attached after a failure).
                Path::new(backing).starts_with(dir) || backing.starts_with("/dev/loop")
            });
        if still_ours {
            // Mounted devices only get autoclear here and go when their last user does.
            detach_loop(&dev);
        }
    }
}

/// Waits (up to 10 s) until a detached loop device lets go of its file: `losetup -d` of a
/// device udev still has open only sets autoclear.
pub fn wait_unbound(dev: &str) {
    let name = dev.trim_start_matches("/dev/");
    let bound = PathBuf::from(format!("/sys/block/{name}/loop"));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while bound.exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Binds the loop device `dev` to `file` once its last detach is done: binding it while udev
/// still holds it is EBUSY (tried for 10 s).
pub fn rebind_loop(dev: &str, file: &Path) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let out = Command::new("losetup")
            .arg(dev)
            .arg(file)
            .output()
            .expect("losetup");
        if out.status.success() {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "losetup {dev}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A child process a test started, killed by its pid and reaped on drop.
pub struct Reaped(pub std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Unmounts, on drop, a mount a test made itself.
pub struct Unmount(pub PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// `losetup -d`, quietly: a device still in use only gets autoclear and goes with its last user.
pub fn detach_loop(dev: &Path) {
    let _ = Command::new("losetup")
        .arg("-d")
        .arg(dev)
        .stderr(Stdio::null())
        .status();
}

/// Makes a directory unwritable even for root is impossible; instead this makes a path whose
/// parent is a regular file, which no one can create a directory under.
pub fn unwritable_dir(scratch: &Scratch) -> PathBuf {
    let f = scratch.join("not-a-dir");
    std::fs::write(&f, b"x").expect("write");
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o444)).expect("chmod");
    f.join("state")
}

/// sha256-free checksum of a whole device or file, good enough to see that bytes changed.
pub fn checksum(path: &Path) -> u64 {
    use std::hash::Hasher;
    use std::io::Read;
    let mut f = std::fs::File::open(path).expect("open for checksum");
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).expect("read");
        if n == 0 {
            break;
        }
        h.write(&buf[..n]);
    }
    h.finish()
}

pub fn sh(script: &str) -> std::process::Output {
    let out = Command::new("sh")
        .arg("-c")
        .arg(script)
        .output()
        .expect("sh");
    assert!(
        out.status.success(),
        "`{script}` failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}
