//! A bind of a namespace's file (a pin) whose place a user covers and fills with a FIFO: the
//! scan opened the pin's place for reading, which waited for a writer for ever, and every later
//! scan waited behind it; the stuck thread kept the user's namespace alive, so every stage on
//! the node was refused until a writer came, the user's processes gone or not (a fifty-fourth
//! fresh review's F3). The place is now opened `O_PATH` and checked to be the pin's own mount
//! before anything is opened.

use std::os::unix::fs::FileTypeExt;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::{Duration, Instant};

use ebs_tests::*;

#[tokio::test]
async fn a_fifo_at_a_covered_pins_place_hangs_no_scan() {
    let _ns = crate::NAMESPACE_COPY.write().await;
    if !require_root("a_fifo_at_a_covered_pins_place_hangs_no_scan") {
        return;
    }
    let scratch = Scratch::new("node-local-pins");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let u = scratch.join("u");
    std::fs::create_dir_all(&u).expect("the user's directory");
    // In a user's own namespace: a newer namespace's file bound at u/d/pin (the kernel refuses a
    // namespace older than the one it is bound in, and ids are handed out in batches per CPU:
    // tried again), u/d covered, a FIFO at the pin's name.
    let holder = Command::new("unshare")
        .args(["-U", "-r", "-m", "--propagation", "private", "sh", "-c"])
        .arg(format!(
            "set -e; mount -t tmpfs ebs-test-pins '{u}'; mkdir '{u}/d'; touch '{u}/d/pin'; \
             for i in $(seq 50); do \
               unshare -m sleep 600 & c=$!; \
               while [ \"$(readlink /proc/$c/ns/mnt)\" = \"$(readlink /proc/self/ns/mnt)\" ]; \
                 do sleep 0.01; done; \
               if mount --bind /proc/$c/ns/mnt '{u}/d/pin' 2>/dev/null; then break; fi; \
               kill $c; wait $c 2>/dev/null || true; \
             done; \
             mount -t tmpfs ebs-test-cover '{u}/d'; mkfifo '{u}/d/pin'; exec sleep 600",
            u = u.display()
        ))
        .process_group(0)
        .spawn()
        .expect("unshare");
    let holder = Group(holder);
    let fifo = format!("/proc/{}/root{}/d/pin", holder.0.id(), u.display());
    let deadline = Instant::now() + Duration::from_secs(20);
    while !std::fs::symlink_metadata(&fifo).is_ok_and(|m| m.file_type().is_fifo()) {
        assert!(
            Instant::now() < deadline,
            "the holder made no FIFO over its pin"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let pinned =
        std::fs::read_to_string(format!("/proc/{}/mountinfo", holder.0.id())).unwrap_or_default();
    assert!(pinned.contains(" - nsfs "), "no pin: {pinned}");
    let disk = crate::Disk::new(&scratch, "free", 64 << 20);
    for round in ["first", "second"] {
        let started = Instant::now();
        if let Err(e) = disk.stage_handle(&agent).await {
            panic!("{round} stage of a free disk refused beside the FIFO: {e:?}");
        }
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "{round} stage took {:?}",
            started.elapsed()
        );
        disk.unstage_handle(&agent).await.expect("unstage");
    }
    // No thread of the agent waits on the FIFO.
    for task in std::fs::read_dir(format!("/proc/{}/task", agent.pid())).expect("threads") {
        let wchan = std::fs::read_to_string(task.expect("a thread").path().join("wchan"));
        assert_ne!(
            wchan.unwrap_or_default(),
            "wait_for_partner",
            "a thread waits on the FIFO"
        );
    }
    drop(holder);
}

/// A process group killed (and its leader reaped) on drop: the holder and its namespace's child.
struct Group(std::process::Child);

impl Drop for Group {
    fn drop(&mut self) {
        let pgid = nix::unistd::Pid::from_raw(self.0.id() as i32);
        let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
        let _ = self.0.wait();
    }
}
