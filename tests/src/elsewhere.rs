//! A bind of a device node that only another mount namespace shows: what a container's runtime
//! leaves when it binds a volume's device into the container, or an operator's `unshare`. A bind
//! does not open the device, so the kernel frees its number at a detach all the same; only the
//! other namespace's mount table tells the bind is there.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// What keeps the other namespace alive.
enum Holder {
    /// A process in it, killed by its pid.
    Process(Child),
    /// No process: a bind of its nsfs file at `file`, in the private mount `dir`.
    Pinned { file: PathBuf, dir: PathBuf },
    /// No process in it: another process holds its nsfs file open.
    HeldOpen(Child),
}

/// A mount namespace of its own (private propagation) that binds `source` at `at` there only;
/// ended on drop (the process killed, or the pin unmounted), which ends its bind.
pub struct BoundElsewhere {
    holder: Holder,
    pub at: PathBuf,
}

/// The ways another namespace holds a bind, for a test to try each.
#[derive(Clone, Copy, Debug)]
pub enum How {
    /// A process is in the namespace.
    Process,
    /// No process: a bind of its nsfs file pins it.
    Pinned,
    /// A process is in it, and a file is bound over the bind.
    Covered,
    /// No process is in it: another process holds its nsfs file open.
    HeldOpen,
}

pub const EVERY_WAY: [How; 4] = [How::HeldOpen, How::Process, How::Covered, How::Pinned];

impl BoundElsewhere {
    /// `source` bound at `at` in another namespace held `how`; `keep` as in `new`.
    pub fn by(how: How, keep: &Path, source: &Path, at: &Path) -> BoundElsewhere {
        match how {
            How::Process => Self::new(keep, source, at),
            How::Covered => Self::covered(keep, source, at),
            How::Pinned => Self::pinned(keep, source, at, &at.with_extension("pin")),
            How::HeldOpen => {
                let inside = Self::new(keep, source, at);
                let Holder::Process(child) = &inside.holder else {
                    unreachable!("new makes a process")
                };
                let holder = Command::new("sh")
                    .arg("-c")
                    .arg(format!(
                        "exec 3</proc/{}/ns/mnt; exec sleep 600",
                        child.id()
                    ))
                    .spawn()
                    .expect("the holder");
                let fd3 = format!("/proc/{}/fd/3", holder.id());
                let deadline = Instant::now() + Duration::from_secs(10);
                while std::fs::read_link(&fd3)
                    .map_or(true, |l| !l.to_string_lossy().starts_with("mnt:"))
                {
                    assert!(
                        Instant::now() < deadline,
                        "the holder never opened the namespace"
                    );
                    std::thread::sleep(Duration::from_millis(20));
                }
                // Its only process goes; the open file keeps the namespace and its bind.
                drop(inside);
                BoundElsewhere {
                    holder: Holder::HeldOpen(holder),
                    at: at.to_path_buf(),
                }
            }
        }
    }

    /// `keep`: the calling test's scratch directory (the copies of the other tests' mounts are
    /// dropped, so their unstages are not refused as "mounted elsewhere").
    pub fn new(keep: &Path, source: &Path, at: &Path) -> BoundElsewhere {
        Self::with_process(keep, source, at, "")
    }

    /// The same, with a file bound over the bind: the mount point then shows the cover.
    pub fn covered(keep: &Path, source: &Path, at: &Path) -> BoundElsewhere {
        let cover = at.with_extension("cover");
        std::fs::write(&cover, b"").expect("the cover");
        Self::with_process(
            keep,
            source,
            at,
            &format!(" && mount --bind '{}' '{}'", cover.display(), at.display()),
        )
    }

    /// The same in a namespace no process is in: `unshare --mount=FILE` pins it with a bind of
    /// its nsfs file (in `pin_dir`, made a private mount as that needs).
    pub fn pinned(keep: &Path, source: &Path, at: &Path, pin_dir: &Path) -> BoundElsewhere {
        std::fs::write(at, b"").expect("the bind's target file");
        std::fs::create_dir_all(pin_dir).expect("the pin's directory");
        let file = pin_dir.join("mnt");
        let bound = BoundElsewhere {
            holder: Holder::Pinned {
                file: file.clone(),
                dir: pin_dir.to_path_buf(),
            },
            at: at.to_path_buf(),
        };
        crate::sh(&format!(
            "mount --bind '{d}' '{d}' && mount --make-private '{d}' && touch '{f}' && \
             unshare --mount='{f}' --propagation private sh -c \"{drop}; mount --bind '{s}' '{a}'\"",
            d = pin_dir.display(),
            f = file.display(),
            drop = crate::drop_other_tests_mounts(keep)
                .replace('"', "\\\"")
                .replace('$', "\\$"),
            s = source.display(),
            a = at.display(),
        ));
        bound
    }

    fn with_process(keep: &Path, source: &Path, at: &Path, then: &str) -> BoundElsewhere {
        std::fs::write(at, b"").expect("the bind's target file");
        let child = Command::new("unshare")
            .args(["-m", "--propagation", "private", "sh", "-c"])
            .arg(format!(
                "{}; mount --bind '{}' '{}'{then} && exec sleep 600",
                crate::drop_other_tests_mounts(keep),
                source.display(),
                at.display()
            ))
            .spawn()
            .expect("unshare");
        let id = child.id();
        let bound = BoundElsewhere {
            holder: Holder::Process(child),
            at: at.to_path_buf(),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        let at_text = at.display().to_string();
        while std::fs::read_to_string(format!("/proc/{id}/mountinfo")).map_or(true, |m| {
            !m.contains(&at_text) || !then.is_empty() && m.matches(&at_text).count() < 2
        }) {
            assert!(
                Instant::now() < deadline,
                "the other namespace never showed its bind at {at_text}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        bound
    }

    /// The bound device as the other namespace sees it (a process's namespace only).
    pub fn path(&self) -> PathBuf {
        match &self.holder {
            Holder::Process(child) => PathBuf::from(format!("/proc/{}/root", child.id()))
                .join(self.at.strip_prefix("/").unwrap_or(&self.at)),
            Holder::Pinned { .. } | Holder::HeldOpen(_) => {
                panic!("a namespace no process is in has no root to look through")
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
