//! What keeps another namespace (and its bind) alive, and how it ends.

use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use super::BoundElsewhere;

/// What keeps the other namespace alive.
pub(super) enum Holder {
    /// A process in it, killed by its pid.
    Process(Child),
    /// No process: a bind of its nsfs file at `file`, in the private mount `dir`.
    Pinned { file: PathBuf, dir: PathBuf },
    /// No process in it: another process holds its nsfs file open.
    HeldOpen(Child),
    /// A process that removes what it made when told to (SIGTERM), killed if it does not.
    Tidy(Child),
    /// A process in it, killed by its pid; then a shell command removes what it made.
    ProcessThen(Child, String),
}

impl BoundElsewhere {
    /// The bound device as the other namespace sees it (a process's namespace only).
    pub fn path(&self) -> PathBuf {
        match &self.holder {
            Holder::Process(child) | Holder::Tidy(child) | Holder::ProcessThen(child, _) => {
                PathBuf::from(format!("/proc/{}/root", child.id()))
                    .join(self.at.strip_prefix("/").unwrap_or(&self.at))
            }
            Holder::Pinned { .. } | Holder::HeldOpen(_) => {
                panic!("a namespace no process is in has no root to look through")
            }
        }
    }

    /// The other namespace's mount table, as its process sees it.
    pub fn mountinfo(&self) -> String {
        match &self.holder {
            Holder::Process(child) | Holder::Tidy(child) | Holder::ProcessThen(child, _) => {
                std::fs::read_to_string(format!("/proc/{}/mountinfo", child.id()))
                    .expect("the holder's mount table")
            }
            Holder::Pinned { .. } | Holder::HeldOpen(_) => {
                panic!("a namespace no process is in has no table to read here")
            }
        }
    }

    /// Ends the namespace (and its bind) now.
    pub fn end(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        match &mut self.holder {
            Holder::Process(child) | Holder::HeldOpen(child) => {
                let _ = child.kill();
                let _ = child.wait();
            }
            Holder::ProcessThen(child, cleanup) => {
                let _ = child.kill();
                let _ = child.wait();
                let _ = Command::new("sh").arg("-c").arg(&*cleanup).status();
            }
            Holder::Tidy(child) => {
                let pid = nix::unistd::Pid::from_raw(child.id() as i32);
                let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
                let deadline = Instant::now() + Duration::from_secs(5);
                while Instant::now() < deadline && matches!(child.try_wait(), Ok(None)) {
                    std::thread::sleep(Duration::from_millis(10));
                }
                let _ = child.kill();
                let _ = child.wait();
            }
            Holder::Pinned { file, dir } => {
                let _ = nix::mount::umount2(file.as_path(), nix::mount::MntFlags::MNT_DETACH);
                let _ = nix::mount::umount2(dir.as_path(), nix::mount::MntFlags::MNT_DETACH);
            }
        }
    }
}

impl Drop for BoundElsewhere {
    fn drop(&mut self) {
        self.stop();
    }
}
