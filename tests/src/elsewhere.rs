//! A bind of a device node that only another mount namespace shows: what a container's runtime
//! leaves when it binds a volume's device into the container, or an operator's `unshare`. A bind
//! does not open the device, so the kernel frees its number at a detach all the same; only the
//! other namespace's mount table tells the bind is there.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

mod holder;
mod make;
mod scripts;

use holder::Holder;

use scripts::{DISCONNECTED, LONG_PATH, ON_FIRST_ROOT, THREAD_NS, mknod_like, python};

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
    /// A thread of a process, not its first, is in it (`/proc/<pid>/ns/mnt` shows the first's).
    Thread,
    /// The same, the process's first thread exited since (its `/proc/<pid>/ns` unreadable).
    LeaderGone,
    /// Its only process is chrooted below the bind (its `/proc/<pid>/mountinfo` leaves the
    /// mounts outside its root out).
    Chrooted,
    /// No process is in it, and no bind pins it: a process holds open its nsfs file, opened
    /// through a bind of it that is gone since (the fd's link reads as a path, not `mnt:[N]`).
    HeldThroughGonePin,
    /// A process is in it, and a mount is laid over the namespace's own root: a thread that
    /// enters the namespace has the cover as its root, so the table it reads leaves out the
    /// bind; the process reaches it by its old root.
    CoveredRoot,
    /// The same, with the bind on the namespace's first root (the root it had before its
    /// root's mount was detached), beside the cover rather than below it.
    OnCoveredFirstRoot,
    /// A process is in it; the bind is of a node made in /dev for the test, with a file bound
    /// over the bind, and the node deleted since (its name in the mount table then names
    /// nothing, as a removed device's does).
    DeletedNode,
    /// A process is in it; the bind is of a node made with mknod outside /dev, at a mount point
    /// longer than the kernel resolves in one call.
    LongPath,
    /// A process is in it; the bind is of a node made in the device filesystem at `pts/ptmx`,
    /// which the agent's /dev shows covered by devpts (so the name leads to devpts's ptmx
    /// there), with a tmpfs laid over the bind's directory.
    ShadowedName,
    /// A process is in it; the bind is of a node made in /dev for the test, with a tmpfs laid
    /// over the bind's directory, and the node's name masked since on the host (`mount --bind
    /// /dev/null` over it, the usual way to hide a device).
    MaskedName,
    /// A process is in it; the bind is of a node made with mknod outside the device filesystem
    /// (its name there names nothing), with a tmpfs laid over the bind's directory.
    MknodCovered,
    /// The same, with a file bound over the bind itself.
    MknodStacked,
    /// `MknodCovered` with every mount of the namespace shared (made so after the cover): a
    /// copy of the namespace is a peer of it, and an unmount in the copy would reach it.
    MknodSharedCover,
    /// A process is in it; the bind lies below a bind of a tmpfs's directory `sub`, and the
    /// directory holding it was renamed out of `sub` through the tmpfs's own mount: no path
    /// reaches its mount point, so no table shows it.
    RenamedAway,
    /// The same with a node made with mknod outside the device filesystem: it cannot be told.
    MknodRenamedAway,
    /// A process is in it; the bind is of a node opened by its handle on a filesystem of its
    /// own mounted again since (a disconnected dentry): the table shows "/" as its root.
    Disconnected,
    /// The same, with a tmpfs laid over the bind's directory.
    DisconnectedCovered,
    /// `Disconnected`, the bind made `nodev` (a remount takes that off the very mount).
    DisconnectedNodev,
    /// `Disconnected`, a tmpfs laid over the directory above the bind's, with a symbolic link
    /// in it that leads the bind's path back into the filesystem below (to a place without it).
    DisconnectedSymlinked,
    /// `Disconnected` on an XFS shut down since: a stat of the node fails. It cannot be told,
    /// and the scan fails: not in `EVERY_WAY`.
    DisconnectedShutDown,
    /// `DeletedNode` in a namespace of a user namespace of its own (the copy the agent makes of
    /// it has every mount locked, so the cover stays on): it cannot be told, and the scan
    /// fails. Not in `EVERY_WAY`, whose ways are told.
    DeletedNodeUsersOwn,
    /// What any user can make in a namespace of its own user namespace: `source` (a plain
    /// file) bound below a tmpfs laid over its directory, and another renamed away.
    UsersOwn,
}

pub const EVERY_WAY: [How; 21] = [
    How::Process,
    How::Covered,
    How::Pinned,
    How::HeldOpen,
    How::Thread,
    How::LeaderGone,
    How::Chrooted,
    How::HeldThroughGonePin,
    How::CoveredRoot,
    How::OnCoveredFirstRoot,
    How::DeletedNode,
    How::LongPath,
    How::ShadowedName,
    How::MaskedName,
    How::MknodCovered,
    How::MknodStacked,
    How::RenamedAway,
    How::Disconnected,
    How::DisconnectedCovered,
    How::DisconnectedNodev,
    How::DisconnectedSymlinked,
];

impl BoundElsewhere {
    /// `source` bound at `at` in another namespace held `how`; `keep` as in `new`.
    pub fn by(how: How, keep: &Path, source: &Path, at: &Path) -> BoundElsewhere {
        match how {
            How::Process => Self::new(keep, source, at),
            How::Covered => Self::covered(keep, source, at),
            How::OnCoveredFirstRoot => {
                let spare = at.with_extension("spare");
                std::fs::create_dir_all(&spare).expect("the cover's first place");
                let (child, ready) = python(
                    ON_FIRST_ROOT,
                    &[source.as_os_str(), spare.as_os_str()],
                    None,
                );
                let bound = BoundElsewhere {
                    at: PathBuf::from(format!("/ebs-test-bind-{}", child.id())),
                    holder: Holder::Tidy(child),
                };
                assert!(ready, "the bind on the first root was not made");
                bound
            }
            How::Disconnected
            | How::DisconnectedCovered
            | How::DisconnectedNodev
            | How::DisconnectedSymlinked
            | How::DisconnectedShutDown => {
                let dir = at.with_extension("d").join("y").join("x");
                let work = at.with_extension("fs");
                std::fs::create_dir_all(&dir).expect("the bind's directory");
                std::fs::create_dir_all(&work).expect("the filesystem's directory");
                let tgt = dir.join("tgt");
                std::fs::write(&tgt, b"").expect("the bind's target file");
                let cover = match how {
                    How::DisconnectedCovered => "covered",
                    How::DisconnectedNodev => "nodev",
                    How::DisconnectedSymlinked => "symlinked",
                    How::DisconnectedShutDown => "shutdown",
                    _ => "plain",
                };
                let args = [source.as_os_str(), tgt.as_os_str(), work.as_os_str()];
                let (child, ready) = python(
                    DISCONNECTED,
                    &[&args[..], &[cover.as_ref()]].concat(),
                    Some(keep),
                );
                let bound = BoundElsewhere {
                    at: at.to_path_buf(),
                    holder: Holder::Process(child),
                };
                assert!(ready, "the bind of a disconnected node was not made");
                bound
            }
            How::LongPath => {
                let node = at.with_extension("node");
                mknod_like(source, &node);
                let deep = at.with_extension("deep");
                let (child, ready) =
                    python(LONG_PATH, &[node.as_os_str(), deep.as_os_str()], Some(keep));
                let bound = BoundElsewhere {
                    at: at.to_path_buf(),
                    holder: Holder::Tidy(child),
                };
                assert!(ready, "the bind at a long path was not made");
                bound
            }
            How::ShadowedName => {
                use std::os::unix::fs::MetadataExt;
                let rdev = std::fs::metadata(source).expect("the source device").rdev();
                let (major, minor) = (nix::sys::stat::major(rdev), nix::sys::stat::minor(rdev));
                // A name devpts has too: through the agent's /dev it leads to devpts's ptmx, a
                // character device, where the node is a block device of the same name.
                let name = "ptmx";
                let view = at.with_extension("devview");
                let dir = at.with_extension("d").join("x");
                std::fs::create_dir_all(&view).expect("the view");
                std::fs::create_dir_all(&dir).expect("the bind's directory");
                let tgt = dir.join("tgt");
                std::fs::write(&tgt, b"").expect("the bind's target file");
                let (v, d, t) = (view.display(), dir.display(), tgt.display());
                // The device filesystem without its submounts, to make the node below `pts`.
                let child = Command::new("unshare")
                    .args(["-m", "--propagation", "private", "sh", "-c"])
                    .arg(format!(
                        "{}; mount --bind /dev '{v}' && mknod '{v}/pts/{name}' b {major} {minor} \
                         && mount --bind '{v}/pts/{name}' '{t}' && \
                         mount -t tmpfs ebs-test-cover '{d}' && umount '{v}' && exec sleep 600",
                        crate::drop_other_tests_mounts(keep)
                    ))
                    .spawn()
                    .expect("unshare");
                let id = child.id();
                let bound = BoundElsewhere {
                    holder: Holder::ProcessThen(
                        child,
                        format!(
                            "unshare -m --propagation private sh -c \"mount --bind /dev '{v}' && \
                             rm -f '{v}/pts/{name}'\""
                        ),
                    ),
                    at: at.to_path_buf(),
                };
                let deadline = Instant::now() + Duration::from_secs(10);
                while std::fs::read_to_string(format!("/proc/{id}/mountinfo")).map_or(true, |m| {
                    !m.contains(" - tmpfs ebs-test-cover ") || m.contains(&*v.to_string())
                }) {
                    assert!(Instant::now() < deadline, "the shadowed bind was not made");
                    std::thread::sleep(Duration::from_millis(20));
                }
                bound
            }
            How::MaskedName => {
                let (mut bound, node, made) = Self::dev_node_under_cover(keep, source, at, false);
                // The node stays, masked, until the holder's clean-up below removes both.
                std::mem::forget(made);
                let n = node.display();
                let placeholder = Holder::Pinned {
                    file: PathBuf::new(),
                    dir: PathBuf::new(),
                };
                if let Holder::Process(child) = std::mem::replace(&mut bound.holder, placeholder) {
                    bound.holder = Holder::ProcessThen(
                        child,
                        format!("umount '{n}' 2>/dev/null; rm -f '{n}'"),
                    );
                }
                crate::sh(&format!("mount --bind /dev/null '{n}'"));
                bound
            }
            How::MknodCovered | How::MknodSharedCover => {
                let node = at.with_extension("node");
                mknod_like(source, &node);
                let dir = at.with_extension("d").join("x");
                std::fs::create_dir_all(&dir).expect("the bind's directory");
                let mut then = format!(" && mount -t tmpfs ebs-test-cover '{}'", dir.display());
                if matches!(how, How::MknodSharedCover) {
                    then.push_str(" && mount --make-rshared /");
                }
                let mut bound = Self::with_process(keep, &node, &dir.join("tgt"), &then, &|m| {
                    m.contains(" - tmpfs ebs-test-cover ")
                });
                bound.at = at.to_path_buf();
                bound
            }
            How::RenamedAway | How::MknodRenamedAway | How::UsersOwn => {
                let node = at.with_extension("node");
                let source = if matches!(how, How::MknodRenamedAway) {
                    mknod_like(source, &node);
                    node.as_path()
                } else {
                    source
                };
                Self::renamed_away(keep, source, at, matches!(how, How::UsersOwn))
            }
            How::MknodStacked => {
                let node = at.with_extension("node");
                mknod_like(source, &node);
                Self::covered(keep, &node, at)
            }
            How::DeletedNode | How::DeletedNodeUsersOwn => {
                let users_own = matches!(how, How::DeletedNodeUsersOwn);
                let (bound, node, _made) = Self::dev_node_under_cover(keep, source, at, users_own);
                // From here: the namespace's own copy of /dev refuses (EBUSY).
                std::fs::remove_file(&node).expect("the node goes");
                bound
            }
            How::CoveredRoot => Self::with_process(
                keep,
                source,
                at,
                " && mount -t tmpfs ebs-test-cover /",
                &|m| m.contains(" - tmpfs ebs-test-cover "),
            ),
            How::Pinned => Self::pinned(keep, source, at, &at.with_extension("pin")),
            How::Thread | How::LeaderGone => {
                std::fs::write(at, b"").expect("the bind's target file");
                let ready = at.with_extension("ready");
                let child = Command::new("python3")
                    .args(["-c", THREAD_NS])
                    .arg(source)
                    .arg(at)
                    .arg(&ready)
                    .arg(if matches!(how, How::LeaderGone) {
                        "1"
                    } else {
                        "0"
                    })
                    .spawn()
                    .expect("python3");
                let deadline = Instant::now() + Duration::from_secs(10);
                while !ready.exists() {
                    assert!(
                        Instant::now() < deadline,
                        "the thread never bound {}",
                        at.display()
                    );
                    std::thread::sleep(Duration::from_millis(20));
                }
                BoundElsewhere {
                    holder: Holder::HeldOpen(child),
                    at: at.to_path_buf(),
                }
            }
            How::Chrooted => {
                let jail = at.with_extension("jail");
                std::fs::create_dir_all(jail.join("usr")).expect("the jail");
                for l in ["bin", "lib", "lib64", "sbin"] {
                    let _ = std::os::unix::fs::symlink(format!("usr/{l}"), jail.join(l));
                }
                std::fs::write(at, b"").expect("the bind's target file");
                let child = Command::new("unshare")
                    .args(["-m", "--propagation", "private", "sh", "-c"])
                    .arg(format!(
                        "{}; mount --bind '{}' '{}' && mount --bind /usr '{j}/usr' && \
                         exec chroot '{j}' /usr/bin/sleep 600",
                        crate::drop_other_tests_mounts(keep),
                        source.display(),
                        at.display(),
                        j = jail.display()
                    ))
                    .spawn()
                    .expect("unshare");
                let root = format!("/proc/{}/root", child.id());
                let deadline = Instant::now() + Duration::from_secs(10);
                while std::fs::read_link(&root).map_or(true, |r| r != jail) {
                    assert!(
                        Instant::now() < deadline,
                        "never chrooted into {}",
                        jail.display()
                    );
                    std::thread::sleep(Duration::from_millis(20));
                }
                BoundElsewhere {
                    holder: Holder::HeldOpen(child),
                    at: at.to_path_buf(),
                }
            }
            How::HeldThroughGonePin => {
                let pinned = Self::pinned(keep, source, at, &at.with_extension("pin"));
                let Holder::Pinned { file, .. } = &pinned.holder else {
                    unreachable!("pinned pins")
                };
                let holder = Command::new("sh")
                    .arg("-c")
                    .arg(format!("exec 3<'{}'; exec sleep 600", file.display()))
                    .spawn()
                    .expect("the holder");
                let fd3 = format!("/proc/{}/fd/3", holder.id());
                let deadline = Instant::now() + Duration::from_secs(10);
                while std::fs::read_link(&fd3).is_err() {
                    assert!(Instant::now() < deadline, "the holder never opened the pin");
                    std::thread::sleep(Duration::from_millis(20));
                }
                // The pin goes (unmounted lazily); the open file alone keeps the namespace.
                drop(pinned);
                let link = std::fs::read_link(&fd3).expect("the holder's fd");
                assert!(
                    !link.to_string_lossy().starts_with("mnt:"),
                    "the held file reads as a namespace link: {link:?}"
                );
                BoundElsewhere {
                    holder: Holder::HeldOpen(holder),
                    at: at.to_path_buf(),
                }
            }
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
}
