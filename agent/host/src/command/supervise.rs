//! Watching a running tool from the calling thread: its two output pipes and its exit are
//! multiplexed with poll(2), so running a tool costs no extra threads. (Three helper threads per
//! tool, two readers and a waiter, were a measurable share of the agent's CPU in the bench: each
//! is a clone, a stack mapping and a TLB shootdown when it is unmapped.)

use std::collections::VecDeque;
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::process::ExitStatus;

use super::spawn::Tool;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid};
use nix::unistd::Pid;

/// Per-stream capture limit; mkfs/e2fsck can be chatty on large devices.
/// Half is spent on the head (what the tool was doing) and half on the tail
/// (where errors are reported).
pub const CAPTURE_LIMIT: usize = 64 * 1024;
/// After the child exits, how long to wait for its pipes to reach EOF. A
/// stray grandchild holding them open must not hang the caller.
const DRAIN_GRACE: Duration = Duration::from_secs(1);
/// Without a pidfd (kernels before 5.3) an exit is noticed by asking waitid between polls; the
/// pause between two questions starts here and doubles up to `MAX_PAUSE`.
const FIRST_PAUSE: Duration = Duration::from_millis(1);
const MAX_PAUSE: Duration = Duration::from_millis(50);

/// A capture buffer that keeps the head and the tail of a stream.
#[derive(Default)]
struct Captured {
    head: Vec<u8>,
    tail: VecDeque<u8>,
    dropped: usize,
}

impl Captured {
    fn push(&mut self, mut data: &[u8]) {
        let half = CAPTURE_LIMIT / 2;
        let room = half.saturating_sub(self.head.len()).min(data.len());
        self.head.extend_from_slice(&data[..room]);
        data = &data[room..];
        self.tail.extend(data);
        let excess = self.tail.len().saturating_sub(half);
        self.tail.drain(..excess);
        self.dropped += excess;
    }

    fn text(&self) -> String {
        let mut bytes = self.head.clone();
        if self.dropped > 0 {
            bytes.extend_from_slice(
                format!("\n[... {} bytes omitted ...]\n", self.dropped).as_bytes(),
            );
        }
        bytes.extend(&self.tail);
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// One output pipe of the child and what was read from it.
struct Stream {
    pipe: Option<File>,
    captured: Captured,
}

impl Stream {
    fn new(pipe: Option<OwnedFd>) -> Self {
        Stream {
            pipe: pipe.map(File::from),
            captured: Captured::default(),
        }
    }

    /// Reads what poll said is there; EOF or an error closes the stream. Reading keeps going
    /// past the capture limit so the child never blocks on a full pipe.
    fn read_ready(&mut self) {
        let Some(pipe) = self.pipe.as_mut() else {
            return;
        };
        let mut chunk = [0u8; 8192];
        match pipe.read(&mut chunk) {
            Ok(0) => self.pipe = None,
            Ok(n) => self.captured.push(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => self.pipe = None,
        }
    }
}

/// How a supervised child ended.
pub enum Ended {
    Exited {
        status: ExitStatus,
        stdout: String,
        stderr: String,
    },
    /// Still running at the deadline, and not reaped: its pid is still valid for a kill.
    TimedOut,
}

/// Reads the child's pipes until it exits (and its pipes reach EOF, or `DRAIN_GRACE` passes),
/// or until `deadline`.
pub fn supervise(
    child: &mut Tool,
    stdout: Option<OwnedFd>,
    stderr: Option<OwnedFd>,
    deadline: Instant,
) -> std::io::Result<Ended> {
    // Readable once the child has exited; optional because old kernels lack pidfd_open.
    let pidfd = pidfd_of(child);
    supervise_with(child, stdout, stderr, deadline, pidfd)
}

fn pidfd_of(child: &Tool) -> Option<OwnedFd> {
    let pid = rustix::process::Pid::from_raw(i32::try_from(child.id()).ok()?)?;
    rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).ok()
}

fn supervise_with(
    child: &mut Tool,
    stdout: Option<OwnedFd>,
    stderr: Option<OwnedFd>,
    deadline: Instant,
    pidfd: Option<OwnedFd>,
) -> std::io::Result<Ended> {
    let pid = Pid::from_raw(i32::try_from(child.id()).map_err(std::io::Error::other)?);
    let mut streams = [Stream::new(stdout), Stream::new(stderr)];
    let mut pause = FIRST_PAUSE;
    let mut exited_at: Option<Instant> = None;
    loop {
        let now = Instant::now();
        if exited_at.is_none() && has_exited(pid)? {
            exited_at = Some(now);
        }
        let all_closed = streams.iter().all(|s| s.pipe.is_none());
        let until = match exited_at {
            Some(at) if all_closed || now >= at + DRAIN_GRACE => break,
            Some(at) => at + DRAIN_GRACE,
            None if now >= deadline => return Ok(Ended::TimedOut),
            None => deadline,
        };
        let mut wait = until.saturating_duration_since(now);
        if exited_at.is_none() && pidfd.is_none() {
            wait = wait.min(pause);
            pause = (pause * 2).min(MAX_PAUSE);
        }

        let mut fds: Vec<PollFd> = streams
            .iter()
            .filter_map(|s| s.pipe.as_ref())
            .map(|p| PollFd::new(p.as_fd(), PollFlags::POLLIN))
            .collect();
        let watch_exit = exited_at.is_none();
        if let (Some(fd), true) = (pidfd.as_ref(), watch_exit) {
            fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLIN));
        }
        match poll(&mut fds, timeout(wait)) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
        let ready: Vec<bool> = fds
            .iter()
            .map(|f| f.revents().is_some_and(|r| !r.is_empty()))
            .collect();
        drop(fds);
        let mut flags = ready.into_iter();
        for stream in streams.iter_mut().filter(|s| s.pipe.is_some()) {
            if flags.next() == Some(true) {
                stream.read_ready();
            }
        }
    }
    let status = child.wait()?;
    let [out, err] = streams;
    Ok(Ended::Exited {
        status,
        stdout: out.captured.text(),
        stderr: err.captured.text(),
    })
}

/// Whether the child has exited, without reaping it (WNOWAIT): the pid stays valid for a kill
/// until the caller reaps it.
fn has_exited(pid: Pid) -> std::io::Result<bool> {
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
    loop {
        match waitid(Id::Pid(pid), flags) {
            Ok(WaitStatus::StillAlive) => return Ok(false),
            Ok(_) => return Ok(true),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// A poll timeout that rounds up, so a remainder under a millisecond does not spin.
fn timeout(wait: Duration) -> PollTimeout {
    let ms = wait.as_micros().div_ceil(1000).min(i32::MAX as u128);
    PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX)
}

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;

    use super::super::spawn::spawn;
    use super::*;

    /// A child that closes its pipes first and exits later is still waited for, with and
    /// without a pidfd, and its exit is noticed promptly either way.
    #[test]
    fn exit_after_closing_pipes_with_and_without_pidfd() {
        for with_pidfd in [true, false] {
            let spawned = spawn(
                OsStr::new("sh"),
                &["-c", "echo early; exec >&- 2>&-; sleep 0.3; exit 7"],
            )
            .unwrap();
            let mut child = spawned.tool;
            let (out, err) = (Some(spawned.stdout), Some(spawned.stderr));
            let pidfd = with_pidfd.then(|| pidfd_of(&child).unwrap());
            let start = Instant::now();
            let deadline = start + Duration::from_secs(10);
            let Ended::Exited { status, stdout, .. } =
                supervise_with(&mut child, out, err, deadline, pidfd).unwrap()
            else {
                panic!("timed out");
            };
            let took = start.elapsed();
            assert_eq!(status.code(), Some(7));
            assert_eq!(stdout, "early\n");
            assert!(took >= Duration::from_millis(300), "{took:?}");
            assert!(
                took < Duration::from_millis(300) + MAX_PAUSE * 4,
                "{took:?}"
            );
        }
    }

    #[test]
    fn capture_keeps_head_and_tail() {
        let mut c = Captured::default();
        c.push(b"hello");
        assert_eq!(c.text(), "hello");
        for _ in 0..20 {
            c.push(&[b'x'; 4096]);
        }
        c.push(b"bye");
        let text = c.text();
        assert!(text.starts_with("hello"));
        assert!(text.ends_with("xbye"));
        assert_eq!(c.head.len() + c.tail.len(), CAPTURE_LIMIT);
        assert_eq!(c.dropped, 5 + 20 * 4096 + 3 - CAPTURE_LIMIT);
    }

    #[test]
    fn deadline_leaves_the_child_unreaped() {
        let mut child = spawn(OsStr::new("sleep"), &["5"]).unwrap().tool;
        let deadline = Instant::now() + Duration::from_millis(100);
        let ended = supervise(&mut child, None, None, deadline).unwrap();
        assert!(matches!(ended, Ended::TimedOut));
        // Not reaped: the pid is still ours to kill.
        let pid = Pid::from_raw(i32::try_from(child.id()).unwrap());
        assert!(!has_exited(pid).unwrap());
        child.kill();
        child.wait().unwrap();
    }
}
