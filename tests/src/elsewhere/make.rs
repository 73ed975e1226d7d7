//! How `BoundElsewhere` makes a namespace of its own that binds a node: the shared ways.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use super::BoundElsewhere;
use super::holder::Holder;
use super::scripts::{Removed, mknod_like};

impl BoundElsewhere {
    /// A node made in /dev with `source`'s numbers, bound in a namespace of its own below a
    /// tmpfs laid over the bind's directory (its mount point then shows nothing); the node is
    /// removed when the returned guard drops.
    /// With `users_own`, in a user namespace of its own too.
    pub(super) fn dev_node_under_cover(
        keep: &Path,
        source: &Path,
        at: &Path,
        users_own: bool,
    ) -> (BoundElsewhere, PathBuf, Removed) {
        let name = at
            .file_name()
            .expect("a name")
            .to_string_lossy()
            .into_owned();
        let node = PathBuf::from(format!("/dev/ebs-test-{name}-{}", std::process::id()));
        mknod_like(source, &node);
        let made = Removed(node.clone());
        let dir = at.with_extension("d").join("x");
        std::fs::create_dir_all(&dir).expect("the bind's directory");
        let mut bound = Self::with_process_as(
            keep,
            &node,
            &dir.join("tgt"),
            &format!(" && mount -t tmpfs ebs-test-cover '{}'", dir.display()),
            &|m| m.contains(" - tmpfs ebs-test-cover "),
            users_own,
        );
        bound.at = at.to_path_buf();
        (bound, node, made)
    }

    /// `How::RenamedAway`: `source` bound at `P/dir/node`, where `P` binds `T/sub` of a tmpfs
    /// at `T`, then `T/sub/dir` renamed to `T/dir`.
    /// With `user_ns`, in a user namespace of its own too, with a second bind of `source`
    /// below a tmpfs laid over its directory.
    pub(super) fn renamed_away(
        keep: &Path,
        source: &Path,
        at: &Path,
        user_ns: bool,
    ) -> BoundElsewhere {
        let (t, p) = (at.with_extension("t"), at.with_extension("p"));
        let ready = at.with_extension("ready");
        std::fs::create_dir_all(&t).expect("T");
        std::fs::create_dir_all(&p).expect("P");
        let (t, p, s, r) = (t.display(), p.display(), source.display(), ready.display());
        let user: &[&str] = if user_ns { &["-U", "-r"] } else { &[] };
        let covered = if user_ns {
            format!(
                "mkdir -p '{t}/c/d' && : > '{t}/c/d/f' && mount --bind '{s}' '{t}/c/d/f' && \
                 mount -t tmpfs ebs-test-cover '{t}/c/d' && "
            )
        } else {
            String::new()
        };
        let child = Command::new("unshare")
            .args(user)
            .args(["-m", "--propagation", "private", "sh", "-c"])
            .arg(format!(
                "{}; mount -t tmpfs ebs-test-t '{t}' && {covered}mkdir -p '{t}/sub/dir' && \
                 : > '{t}/sub/dir/node' && mount --bind '{t}/sub' '{p}' && \
                 mount --bind '{s}' '{p}/dir/node' && mv '{t}/sub/dir' '{t}/dir' && \
                 : > '{r}' && exec sleep 600",
                crate::drop_other_tests_mounts(keep)
            ))
            .spawn()
            .expect("unshare");
        let bound = BoundElsewhere {
            holder: Holder::Process(child),
            at: at.to_path_buf(),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !ready.exists() {
            assert!(
                Instant::now() < deadline,
                "the renamed-away bind was not made"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        bound
    }

    /// `keep`: the calling test's scratch directory (the copies of the other tests' mounts are
    /// dropped, so their unstages are not refused as "mounted elsewhere").
    pub fn new(keep: &Path, source: &Path, at: &Path) -> BoundElsewhere {
        Self::with_process(keep, source, at, "", &|_| true)
    }

    /// The same, with a file bound over the bind: the mount point then shows the cover.
    pub fn covered(keep: &Path, source: &Path, at: &Path) -> BoundElsewhere {
        let cover = at.with_extension("cover");
        std::fs::write(&cover, b"").expect("the cover");
        let at_text = at.display().to_string();
        Self::with_process(
            keep,
            source,
            at,
            &format!(" && mount --bind '{}' '{}'", cover.display(), at.display()),
            &|m| m.matches(&at_text).count() >= 2,
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

    /// `then`: more commands run in the namespace after the bind; `done`: whether its table (as
    /// the process sees it) shows they ran.
    pub(super) fn with_process(
        keep: &Path,
        source: &Path,
        at: &Path,
        then: &str,
        done: &dyn Fn(&str) -> bool,
    ) -> BoundElsewhere {
        Self::with_process_as(keep, source, at, then, done, false)
    }

    /// `with_process`; with `users_own`, in a user namespace of its own too (root mapped).
    pub(super) fn with_process_as(
        keep: &Path,
        source: &Path,
        at: &Path,
        then: &str,
        done: &dyn Fn(&str) -> bool,
        users_own: bool,
    ) -> BoundElsewhere {
        std::fs::write(at, b"").expect("the bind's target file");
        let user: &[&str] = if users_own { &["-U", "-r"] } else { &[] };
        let child = Command::new("unshare")
            .args(user)
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
        while std::fs::read_to_string(format!("/proc/{id}/mountinfo"))
            .map_or(true, |m| !m.contains(&at_text) || !done(&m))
        {
            assert!(
                Instant::now() < deadline,
                "the other namespace never showed its bind at {at_text}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        bound
    }
}
