//! A bind of a namespace's file (a pin) whose place a user covers: with a FIFO at its name, the
//! scan opened the place for reading, which waited for a writer for ever, and every later scan
//! waited behind it; the stuck thread kept the user's namespace alive, so every stage on the
//! node was refused until a writer came, the user's processes gone or not (a fifty-fourth fresh
//! review's F3). With a file where its directory was, or a link loop, the open failed and so did
//! every scan (a fifty-fifth's F1). The place is now opened `O_PATH` and checked to be the pin's
//! own mount before anything is opened, and a pin it does not lead to is on the kernel's list.

use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::{Duration, Instant};

use ebs_tests::*;

#[tokio::test]
async fn a_pin_a_user_hides_refuses_nothing_and_hangs_no_scan() {
    let _ns = crate::NAMESPACE_COPY.write().await;
    if !require_root("a_pin_a_user_hides_refuses_nothing_and_hangs_no_scan") {
        return;
    }
    let scratch = Scratch::new("node-local-pins");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let disk = crate::Disk::new(&scratch, "free", 64 << 20);
    // What the user lays at the pin's place once a tmpfs covers it: a FIFO at its name (a
    // fifty-fourth fresh review's F3), a file where its directory was, a link loop there (a
    // fifty-fifth's F1: the open's ENOTDIR and ELOOP failed every scan).
    let cases = [
        ("fifo", "mkdir c && mkfifo c/pin"),
        ("not-a-directory", "touch c"),
        ("link-loop", "ln -s c c"),
    ];
    for (case, cover) in cases {
        let u = scratch.join(&format!("u-{case}"));
        let ready = scratch.join(&format!("ready-{case}"));
        std::fs::create_dir_all(&u).expect("the user's directory");
        // A holder whose every bind of the new namespace failed (EINVAL: the kernel saw a
        // loop, now and then for a run of attempts on this host) exits; a new one, in a new
        // user namespace, is started.
        let mut holder = Group::hiding_a_pin(&u, cover, &ready);
        let deadline = Instant::now() + Duration::from_secs(20);
        while !ready.exists() {
            assert!(
                Instant::now() < deadline,
                "{case}: the holder hid no pin: {}",
                std::fs::read_to_string(format!("{}.err", u.display())).unwrap_or_default()
            );
            if holder.0.try_wait().is_ok_and(|exited| exited.is_some()) && !ready.exists() {
                holder = Group::hiding_a_pin(&u, cover, &ready);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        for round in ["first", "second"] {
            let started = Instant::now();
            if let Err(e) = disk.stage_handle(&agent).await {
                panic!("{case}: {round} stage of a free disk refused beside the pin: {e:?}");
            }
            assert!(
                started.elapsed() < Duration::from_secs(4),
                "{case}: {round} stage took {:?}",
                started.elapsed()
            );
            disk.unstage_handle(&agent).await.expect("unstage");
        }
        // No thread of the agent waits on a FIFO.
        for task in std::fs::read_dir(format!("/proc/{}/task", agent.pid())).expect("threads") {
            let wchan = std::fs::read_to_string(task.expect("a thread").path().join("wchan"));
            assert_ne!(
                wchan.unwrap_or_default(),
                "wait_for_partner",
                "{case}: a thread waits"
            );
        }
        drop(holder);
    }
}

/// A process group killed (and its leader reaped) on drop: the holder and its namespace's child.
struct Group(std::process::Child);

impl Group {
    /// In a user's own namespace: a newer namespace pinned at `u/d/c/pin` (the kernel refuses
    /// a pin of a namespace it counts as older, and ids come in batches per CPU: made on one
    /// CPU, and tried again), then `u/d` covered with a tmpfs and `cover` run in it; `ready`
    /// made once it is done.
    fn hiding_a_pin(u: &std::path::Path, cover: &str, ready: &std::path::Path) -> Group {
        let child = Command::new("unshare")
            .args(["-U", "-r", "-m", "--propagation", "private", "sh", "-c"])
            .arg(format!(
                "set -e; mount -t tmpfs ebs-test-pins '{u}'; mkdir -p '{u}/d/c'; \
                 touch '{u}/d/c/pin'; \
                 for i in $(seq 50); do \
                   if taskset -c 0 unshare --mount='{u}/d/c/pin' true 2>>'{u}.err'; then break; fi; \
                 done; \
                 grep -q ' - nsfs ' /proc/self/mountinfo; \
                 mount -t tmpfs ebs-test-cover '{u}/d'; cd '{u}/d'; {cover}; \
                 touch '{ready}'; exec sleep 600",
                u = u.display(),
                ready = ready.display()
            ))
            .process_group(0)
            .spawn()
            .expect("unshare");
        Group(child)
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        let pgid = nix::unistd::Pid::from_raw(self.0.id() as i32);
        let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
        let _ = self.0.wait();
    }
}
