//! The helper scripts and small host tools the ways of `BoundElsewhere` use.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};

/// A process whose second thread has a mount namespace of its own with `src` bound at `dst`
/// there; with `1` as the last argument its first thread then exits (the process lives on).
pub(super) const THREAD_NS: &str = r#"
import ctypes, os, sys, threading, time
libc = ctypes.CDLL(None, use_errno=True)
src, dst, ready, leader_exits = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
def inside():
    if libc.unshare(0x00020000 | 0x00000200) != 0: os._exit(3)
    if libc.mount(None, b"/", None, 0x4000 | 0x40000, None) != 0: os._exit(4)
    if libc.mount(src.encode(), dst.encode(), None, 0x1000, None) != 0: os._exit(5)
    open(ready, "w").close()
    while True: time.sleep(3600)
threading.Thread(target=inside).start()
while not os.path.exists(ready): time.sleep(0.01)
if leader_exits:
    libc.syscall({"x86_64": 60, "aarch64": 93}[os.uname().machine], 0)
while True: time.sleep(3600)
"#;

/// Binds argv[1] on the first root of a namespace of its own, below a tmpfs (mounted at argv[2]
/// first, then moved) laid over that root; removes the bind and its file on SIGTERM.
pub(super) const ON_FIRST_ROOT: &str = r#"
import signal
src, spare = sys.argv[1].encode(), sys.argv[2].encode()
ck(libc.unshare(0x20000), "unshare")
ck(libc.mount(None, b"/", None, 0x4000 | 0x40000, None), "private")
own = ck(os.open("/proc/self/ns/mnt", os.O_RDONLY), "own")
ck(libc.mount(b"ebs-test-cover", spare, b"tmpfs", 0, None), "tmpfs")
cover = ck(libc.syscall(428, -100, spare, 1 | 0o2000000), "open_tree cover")
node = ck(libc.syscall(428, -100, src, 1 | 0o2000000), "open_tree node")
ck(libc.umount2(spare, 2), "umount spare")
ck(libc.umount2(b"/", 2), "umount /")
ck(libc.setns(own, 0x20000), "setns")
y = b"/ebs-test-bind-%d" % os.getpid()
os.close(ck(os.open(y, os.O_CREAT | os.O_WRONLY, 0o600), "create"))
ck(libc.syscall(429, node, b"", -100, y, 4), "move the bind")
ck(libc.syscall(429, cover, b"", -100, b"/", 4), "move the cover")
def bye(*_):
    libc.umount2(y, 2); os.unlink(y); os._exit(0)
signal.signal(signal.SIGTERM, bye)
print("ready", flush=True)
signal.pause()
"#;

/// Binds the node argv[1] at the end of 20 nested directories of 250-character names made below
/// argv[2] (run in a private mount namespace of its own).
pub(super) const LONG_PATH: &str = r#"
import signal
os.makedirs(sys.argv[2], exist_ok=True); os.chdir(sys.argv[2])
for _ in range(20):
    os.makedirs("d" * 250, exist_ok=True); os.chdir("d" * 250)
open("leaf", "w").close()
if libc.mount(sys.argv[1].encode(), b"leaf", None, 0x1000, None) != 0:
    print("error", os.strerror(ctypes.get_errno()), flush=True); os._exit(1)
print("ready", flush=True)
signal.pause()
"#;

/// Binds at argv[2] (a file) a block device node with argv[1]'s numbers, made on an ext4
/// filesystem of its own (an image in argv[3]), through a handle opened once that filesystem was
/// mounted again: its dentry is disconnected, so the table shows "/" as the bind's root, as a
/// whole filesystem's (a fifty-first fresh review's F1). argv[4]: "covered" lays a tmpfs over
/// argv[2]'s directory then; "nodev" makes the bind `nodev` (a remount takes that off again);
/// "symlinked" lays a tmpfs over the directory two above argv[2]'s, holding a symbolic link by
/// the name of the one between back to a directory of the filesystem below; "shutdown" makes the
/// filesystem XFS and shuts it down (a stat of the node then fails).
/// Run in a private mount namespace of its own: the filesystem lives only there, and its loop
/// device goes (autoclear) when the namespace does.
pub(super) const DISCONNECTED: &str = r#"
import stat, subprocess, signal
def run(*argv):
    if subprocess.run(argv, stdout=subprocess.DEVNULL).returncode != 0:
        print("error", argv, flush=True); os._exit(1)
src, tgt, work, how = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
img, e = os.path.join(work, "fs.img"), os.path.join(work, "e")
os.makedirs(e, exist_ok=True)
with open(img, "wb") as f: f.truncate((320 if how == "shutdown" else 16) << 20)
if how == "shutdown":
    run("mkfs.xfs", "-q", "-f", img)
else:
    run("mkfs.ext4", "-q", "-F", img)
run("mount", "-o", "loop", img, e)
node = os.path.join(e, "node")
os.mknod(node, 0o600 | stat.S_IFBLK, os.stat(src).st_rdev)
class Handle(ctypes.Structure):
    _fields_ = [("size", ctypes.c_uint), ("kind", ctypes.c_int), ("f", ctypes.c_ubyte * 128)]
h, mnt = Handle(), ctypes.c_int()
h.size = 128
ck(libc.name_to_handle_at(-100, node.encode(), ctypes.byref(h), ctypes.byref(mnt), 0), "handle")
run("umount", e)
run("mount", "-o", "loop", img, e)
d = ck(os.open(e, os.O_RDONLY | os.O_DIRECTORY), "open e")
fd = ck(libc.open_by_handle_at(d, ctypes.byref(h), os.O_PATH), "open_by_handle_at")
if os.readlink("/proc/self/fd/%d" % fd) != "/":
    print("error: the node's dentry is connected", flush=True); os._exit(1)
tree = ck(libc.syscall(428, fd, b"", 1 | 0o2000000 | 0x1000), "open_tree")
ck(libc.syscall(429, tree, b"", -100, tgt.encode(), 4), "move_mount")
for x in (tree, fd, d): os.close(x)
if how == "shutdown":
    run("xfs_io", "-x", "-c", "shutdown", e)
ck(libc.umount2(e.encode(), 2), "umount e")
if how == "covered":
    ck(libc.mount(b"ebs-test-cover", os.path.dirname(tgt).encode(), b"tmpfs", 0, None), "cover")
if how == "symlinked":
    # tgt is A/y/x/tgt: A covered, A/y a link to R, where R/x is (and R/x/tgt is not).
    x = os.path.dirname(tgt); y = os.path.dirname(x); above = os.path.dirname(y)
    real = os.path.join(work, "real")
    os.makedirs(os.path.join(real, os.path.basename(x)), exist_ok=True)
    ck(libc.mount(b"ebs-test-cover", above.encode(), b"tmpfs", 0, None), "cover")
    os.symlink(real, os.path.join(above, os.path.basename(y)))
if how == "nodev":
    ck(libc.mount(None, tgt.encode(), None, 0x20 | 0x1000 | 0x4, None), "nodev")
print("ready", flush=True)
signal.pause()
"#;

/// What every script `python` runs starts with: libc, and `ck`, which ends the script with the
/// error where a call fails.
const PRELUDE: &str = r#"
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
def ck(rc, what):
    if rc < 0:
        print("error", what, os.strerror(ctypes.get_errno()), flush=True); os._exit(1)
    return rc
"#;

/// Runs a helper script with its arguments (`in_own`: in a private mount namespace of its own,
/// with the copies of the other tests' mounts dropped but `keep`'s); whether it said it was
/// ready.
pub(super) fn python(script: &str, args: &[&OsStr], in_own: Option<&Path>) -> (Child, bool) {
    let mut command = match in_own {
        None => Command::new("/usr/bin/python3"),
        Some(keep) => {
            let mut c = Command::new("unshare");
            c.args(["-m", "--propagation", "private", "sh", "-c"])
                .arg(format!(
                    "{}; exec \"$@\"",
                    crate::drop_other_tests_mounts(keep)
                ))
                .args(["sh", "/usr/bin/python3"]);
            c
        }
    };
    let mut child = command
        .arg("-c")
        .arg(format!("{PRELUDE}{script}"))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3");
    let mut line = String::new();
    let out = child.stdout.take().expect("piped");
    let _ = std::io::BufRead::read_line(&mut std::io::BufReader::new(out), &mut line);
    (child, line.trim() == "ready")
}

/// A block device node at `node` with the device numbers of `source`.
pub(super) fn mknod_like(source: &Path, node: &Path) {
    use std::os::unix::fs::MetadataExt;
    let rdev = std::fs::metadata(source).expect("the source device").rdev();
    let _ = std::fs::remove_file(node);
    nix::sys::stat::mknod(
        node,
        nix::sys::stat::SFlag::S_IFBLK,
        nix::sys::stat::Mode::from_bits_truncate(0o600),
        rdev,
    )
    .expect("mknod");
}

/// Removes a file on drop (a node made in /dev, also when its test fails).
pub(super) struct Removed(pub(super) PathBuf);

impl Drop for Removed {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
