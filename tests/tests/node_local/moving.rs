//! Issue 52's list of mount namespaces, attacked where a scan is not atomic (a forty-fourth fresh
//! review): a bind's holder moves to a fresh copy of its namespace (unshare) while the agent's
//! scan is half-way, the namespace it leaves dies, and the copy keeps the bind. The kernel hands
//! out namespace ids in batches per CPU, so a copy made on the other CPU sits behind the list's
//! cursor (F1); and nsfs gives a freed inode number to the next namespace made, so a copy may
//! take the number of a namespace the scan has read and let go (F2). Either way the device is
//! still bound, and a node-local handle must not take it.
//!
//! The scan's moment is seen from outside: the agent reads a namespace from a thread it moves
//! into it, so `/proc/<agent>/task/*/ns/mnt` shows when the scan is among the filler namespaces
//! made for it to pass through.

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use ebs_tests::*;

use tonic::Code;

/// The namespaces' helpers, in Python with ctypes (Debian's python3, as the seccomp tests use).
const HELPER: &str = r#"
import ctypes, fcntl, os, signal, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
def check(rc, what):
    if rc != 0:
        e = ctypes.get_errno(); raise OSError(e, what + ": " + os.strerror(e))
def unshare():
    check(libc.unshare(0x20000), "unshare")
def mount(src, dst, flags):
    check(libc.mount(src, dst, None, flags, None), "mount")
def ns_id():
    fd = os.open("/proc/thread-self/ns/mnt", os.O_RDONLY)
    buf = bytearray(struct.pack("IIQ", 16, 0, 0))
    fcntl.ioctl(fd, 0x8010b70a, buf, True)  # NS_MNT_GET_INFO
    os.close(fd)
    return struct.unpack("IIQ", buf)[2]
mode = sys.argv[1]
if mode == "ids":
    for cpu in sorted(os.sched_getaffinity(0))[:2]:
        pid = os.fork()
        if pid == 0:
            os.sched_setaffinity(0, {cpu}); unshare(); print(cpu, ns_id(), flush=True); os._exit(0)
        os.waitpid(pid, 0)
elif mode == "fill":
    os.sched_setaffinity(0, {int(sys.argv[3])})
    kept = []
    for _ in range(int(sys.argv[2])):
        unshare()
        kept.append(os.open("/proc/thread-self/ns/mnt", os.O_RDONLY))
        print(os.fstat(kept[-1]).st_ino)
    sys.stdout.flush(); os.close(1)
    signal.pause()
elif mode == "alone":
    os.sched_setaffinity(0, {int(sys.argv[2])}); unshare()
    print(os.stat("/proc/thread-self/ns/mnt").st_ino, flush=True)
    signal.pause()
elif mode == "move":
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    os.sched_setaffinity(0, {int(sys.argv[4])}); unshare()
    mount(None, b"/", 0x4000 | 0x40000)  # MS_REC | MS_PRIVATE
    mount(sys.argv[2].encode(), sys.argv[3].encode(), 0x1000)  # MS_BIND
    print("bound", flush=True)
    while True:
        signal.sigwait({signal.SIGUSR1})
        os.sched_setaffinity(0, {int(sys.argv[5])}); unshare()
        print("moved", flush=True)
"#;

/// A helper process, killed by its pid on drop (its namespaces die with it).
struct Helper {
    child: Child,
    out: BufReader<ChildStdout>,
}

impl Helper {
    fn spawn(args: &[&str]) -> Helper {
        let mut child = Command::new("/usr/bin/python3")
            .args(["-c", HELPER])
            .args(args)
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3");
        let out = BufReader::new(child.stdout.take().expect("piped"));
        Helper { child, out }
    }

    fn line(&mut self) -> String {
        let mut l = String::new();
        self.out.read_line(&mut l).expect("the helper's line");
        assert!(!l.is_empty(), "the helper ended early");
        l.trim().to_string()
    }

    /// Every line until the helper closes its output.
    fn lines(&mut self) -> Vec<String> {
        (&mut self.out).lines().map_while(Result::ok).collect()
    }

    fn end(mut self) {
        self.finish();
    }

    fn finish(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        self.finish();
    }
}

/// The two CPUs, the one whose next namespace id is higher first; None on one CPU.
fn cpus_by_next_id() -> Option<(String, String)> {
    let mut h = Helper::spawn(&["ids"]);
    let mut ids: Vec<(u64, String)> = h
        .lines()
        .iter()
        .filter_map(|l| {
            let (cpu, id) = l.split_once(' ')?;
            Some((id.parse().ok()?, cpu.to_string()))
        })
        .collect();
    if ids.len() < 2 {
        return None;
    }
    ids.sort();
    Some((ids[1].1.clone(), ids[0].1.clone()))
}

/// The agent's threads' mount namespaces.
fn scan_threads_in(agent_pid: u32) -> HashSet<u64> {
    std::fs::read_dir(format!("/proc/{agent_pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|t| std::fs::read_link(t.path().join("ns/mnt")).ok())
        .filter_map(|l| {
            let l = l.to_string_lossy().into_owned();
            l.strip_prefix("mnt:[")?.strip_suffix(']')?.parse().ok()
        })
        .collect()
}

/// Stages the handle of `dev` while watching the agent's threads: the first time one is in a
/// namespace of `among`, `fire` runs (once). Returns the stage's answer and whether it fired.
async fn stage_firing(
    agent: &Agent,
    disk: &super::Disk,
    among: HashSet<u64>,
    fire: impl FnOnce() + Send + 'static,
) -> (Result<(), tonic::Status>, bool) {
    let done = Arc::new(AtomicBool::new(false));
    let pid = agent.pid();
    let watcher = {
        let done = done.clone();
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                if scan_threads_in(pid).iter().any(|n| among.contains(n)) {
                    fire();
                    return true;
                }
            }
            false
        })
    };
    let answer = disk.stage_handle(agent).await;
    done.store(true, Ordering::Relaxed);
    (answer, watcher.join().expect("the watcher"))
}

/// An agent that takes the kernel's list of namespaces, or (`walked`) one that walks /proc for
/// them, as before Linux 6.12.
async fn agent(scratch: &Scratch, walked: bool) -> Agent {
    let mut agent = Agent::unstarted(scratch, AgentOpts::default());
    if walked {
        agent.wrapper = ebs_tests::seccomp::without_namespace_list();
    }
    agent.spawn().await;
    agent
}

fn parse_inodes(lines: &[String]) -> HashSet<u64> {
    lines.iter().filter_map(|l| l.parse().ok()).collect()
}

/// One attack: fillers made on `fill_cpu`, a holder bound on `cpus.0` that moves to a copy made
/// on `cpus.1` once the scan is among the fillers (after `first`), and a handle's stage of the
/// device meanwhile, which must be refused.
#[allow(clippy::too_many_arguments)]
async fn attack(
    agent: &Agent,
    scratch: &Scratch,
    disk: &super::Disk,
    label: &str,
    fill_cpu: &str,
    cpus: (&str, &str),
    first: impl FnOnce() + Send + 'static,
) {
    let mut fillers = Helper::spawn(&["fill", "200", fill_cpu]);
    let among = parse_inodes(&fillers.lines());
    let at = scratch.join(&format!("ctr-{}", label.replace(' ', "-")));
    std::fs::write(&at, b"").unwrap();
    let dev = disk.dev.display().to_string();
    let mut mover = Helper::spawn(&["move", &dev, &at.display().to_string(), cpus.0, cpus.1]);
    assert_eq!(mover.line(), "bound");
    let mover_pid = nix::unistd::Pid::from_raw(mover.child.id() as i32);
    let fire = move || {
        first();
        let _ = nix::sys::signal::kill(mover_pid, nix::sys::signal::Signal::SIGUSR1);
    };
    let (answer, fired) = stage_firing(agent, disk, among, fire).await;
    assert!(fired, "{label}: the scan never passed the fillers");
    assert_eq!(mover.line(), "moved");
    let e = answer.expect_err(&format!(
        "{label}: a handle took a device whose holder moved mid-scan"
    ));
    assert_eq!(e.code(), Code::FailedPrecondition, "{label}: {e:?}");
    mover.end();
    fillers.end();
}

/// Three rounds with the kernel's list, two with the walk.
const ROUNDS: [(u32, bool); 5] = [(0, false), (1, false), (2, false), (3, true), (4, true)];

/// F1: the holder moves to a copy made on the CPU whose ids are lower, while the scan is among
/// namespaces made on the other; the namespace it leaves, made after them, dies unread.
#[tokio::test]
async fn a_holder_moving_to_a_namespace_behind_the_list_keeps_its_device() {
    let _ns = crate::NAMESPACE_COPY.write().await;
    if !require_root("a_holder_moving_to_a_namespace_behind_the_list_keeps_its_device") {
        return;
    }
    let Some((high, low)) = cpus_by_next_id() else {
        assert!(!is_ci(), "CI runs on two CPUs at least");
        skip(
            "a_holder_moving_to_a_namespace_behind_the_list_keeps_its_device",
            "one CPU: namespace ids come in one batch",
        );
        return;
    };
    let scratch = Scratch::new("node-local-moving");
    let disk = super::Disk::new(&scratch, "d", 64 << 20);
    for (round, walked) in ROUNDS {
        let agent = agent(&scratch, walked).await;
        let label = format!("behind {round} (walked: {walked})");
        attack(&agent, &scratch, &disk, &label, &high, (&high, &low), || {}).await;
    }
}

/// F2: the holder's copy takes the inode number of a namespace the scan read before (its only
/// process killed once the scan is past it).
#[tokio::test]
async fn a_holder_moving_to_a_reused_namespace_number_keeps_its_device() {
    let _ns = crate::NAMESPACE_COPY.write().await;
    if !require_root("a_holder_moving_to_a_reused_namespace_number_keeps_its_device") {
        return;
    }
    let scratch = Scratch::new("node-local-renumbered");
    let disk = super::Disk::new(&scratch, "d", 64 << 20);
    for (round, walked) in ROUNDS {
        let agent = agent(&scratch, walked).await;
        let mut alone = Helper::spawn(&["alone", "0"]);
        let _first: u64 = alone.line().parse().expect("an inode number");
        let label = format!("renumbered {round} (walked: {walked})");
        let first = move || {
            alone.end();
            std::thread::sleep(std::time::Duration::from_millis(3));
        };
        attack(&agent, &scratch, &disk, &label, "0", ("0", "0"), first).await;
    }
}
