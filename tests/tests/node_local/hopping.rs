//! A bind kept up at every moment while it hops between two namespaces as the scan moves (a
//! fiftieth fresh review's F1): made in A once the scan is past A, then taken away from B
//! before the scan reaches B; made in B again once the scan is past B, then taken from A. Each
//! namespace is read while the bind is in the other, and the device is bound throughout: a
//! node-local handle must never take it.
//!
//! The scan's moment is seen from outside, as in `moving`: the agent reads a namespace from a
//! thread it moves into it. A third namespace C, read between A and B (namespaces made in that
//! order are listed in that order), holds a thousand binds so that reading it takes a while.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use ebs_tests::*;

use tonic::Code;

/// argv: the device, the agent's pid, a scratch directory. Says "ready" once the bind is in B;
/// hops until SIGTERM, then takes its bind away and ends its namespaces.
const HOPPER: &str = r#"
import ctypes, os, signal, subprocess, sys, time
libc = ctypes.CDLL(None, use_errno=True)
dev, agent, d = sys.argv[1].encode(), int(sys.argv[2]), sys.argv[3]
def chk(rc, what):
    if rc != 0:
        e = ctypes.get_errno(); raise OSError(e, what + ": " + os.strerror(e))
def holder():
    p = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sleep", "600"])
    for _ in range(200):
        if os.stat(f"/proc/{p.pid}/ns/mnt").st_ino != os.stat("/proc/self/ns/mnt").st_ino:
            return p
        time.sleep(0.01)
    raise OSError("no namespace")
holders = [holder(), holder(), holder()]
fa, fc, fb = (os.open(f"/proc/{p.pid}/ns/mnt", os.O_RDONLY) for p in holders)
ic, ib = os.fstat(fc).st_ino, os.fstat(fb).st_ino
stop = [False]
def bye(*_): stop[0] = True
signal.signal(signal.SIGTERM, bye)
chk(libc.unshare(0x200), "unshare fs")
node_a, node_b = (d + "/nodeA").encode(), (d + "/nodeB").encode()
for p in (node_a, node_b): open(p, "a").close()
chk(libc.setns(fc, 0x20000), "setns C")
src = (d + "/src").encode(); open(src, "a").close()
for i in range(1000):
    t = f"{d}/f{i}".encode(); open(t, "a").close()
    chk(libc.mount(src, t, None, 4096, None), "fill C")
def move(to_ns, to, from_ns, frm):
    chk(libc.setns(to_ns, 0x20000), "setns"); chk(libc.mount(dev, to, None, 4096, None), "bind")
    chk(libc.setns(from_ns, 0x20000), "setns"); chk(libc.umount2(frm, 2), "umount")
chk(libc.setns(fb, 0x20000), "setns B"); chk(libc.mount(dev, node_b, None, 4096, None), "bind B")
print("ready", flush=True)
def scanning():
    out = set()
    for t in os.listdir(f"/proc/{agent}/task"):
        try: out.add(os.stat(f"/proc/{agent}/task/{t}/ns/mnt").st_ino)
        except OSError: pass
    return out
where, since, seen_b = "B", 0.0, False
while not stop[0]:
    now = scanning()
    if where == "B" and ic in now:
        move(fa, node_a, fb, node_b); where, since, seen_b = "A", time.time(), False
    elif where == "A":
        seen_b = seen_b or ib in now
        if (seen_b and ib not in now) or time.time() - since > 1.0:
            move(fb, node_b, fa, node_a); where = "B"
if where == "A":
    move(fb, node_b, fa, node_a)
chk(libc.setns(fb, 0x20000), "setns B"); libc.umount2(node_b, 2)
for p in holders: p.kill(); p.wait()
"#;

/// The hopper, stopped (SIGTERM, then killed) on drop.
struct Hopper(Child);

impl Drop for Hopper {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.0.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::time::Instant::now() < deadline && matches!(self.0.try_wait(), Ok(None)) {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn a_bind_hopping_between_namespaces_as_the_scan_moves_keeps_its_device() {
    let _ns = crate::NAMESPACE_COPY.write().await;
    if !require_root("a_bind_hopping_between_namespaces_as_the_scan_moves_keeps_its_device") {
        return;
    }
    let scratch = Scratch::new("node-local-hop");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let disk = crate::Disk::new(&scratch, "d", 64 << 20);
    let dir = scratch.join("hop");
    std::fs::create_dir_all(&dir).expect("the hopper's directory");
    let mut child = Command::new("/usr/bin/python3")
        .args(["-c", HOPPER])
        .arg(&disk.dev)
        .arg(agent.pid().to_string())
        .arg(&dir)
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    let out = child.stdout.take().expect("piped");
    let hopper = Hopper(child);
    let mut line = String::new();
    let _ = BufReader::new(out).read_line(&mut line);
    assert_eq!(line.trim(), "ready", "the hopper did not start");
    for attempt in 0..12 {
        match disk.stage_handle(&agent).await {
            Err(e) => assert_eq!(e.code(), Code::FailedPrecondition, "{attempt}: {e:?}"),
            Ok(()) => {
                let _ = disk.unstage_handle(&agent).await;
                panic!("attempt {attempt}: a handle took a device bound at every moment");
            }
        }
    }
    drop(hopper);
}
