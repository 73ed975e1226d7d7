//! Issue 49: recovery proves from the host before it takes a read-only block device away. After
//! `recover --reset`, `recover --from-mounts` or a state file cut to 0 bytes, the next start keeps
//! the read-only device a live read-only raw block publication binds (the workload's device
//! reads on); `--from-mounts` rebuilds the publication, so unpublish then detaches it. And two
//! agents whose state files have one path in two mount namespaces never take each other's.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use ebs_tests::csi_req::*;
use ebs_tests::*;

use csi::volume_capability::access_mode::Mode;

use super::is_mounted;
use super::ro_block::{Overlays, PATTERN, check_read_only, head, loops_over, staged_block, target};

/// Starts the agent again on its state; Err when it refuses to start (a 0-byte state file may
/// be refused as corrupt: then nothing may have been taken away either).
async fn start_again(agent: &mut Agent) -> Result<(), String> {
    agent.opts.wait_ready = false;
    agent.spawn().await;
    agent.opts.wait_ready = true;
    agent.try_wait_ready(Duration::from_secs(30)).await
}

#[tokio::test]
async fn a_rebuilt_or_reset_state_never_detaches_a_live_read_only_block_device() {
    let _ns = crate::NAMESPACE_COPY.read().await;
    if !require_root("a_rebuilt_or_reset_state_never_detaches_a_live_read_only_block_device") {
        return;
    }
    for case in ["--reset", "--from-mounts", "zero-byte"] {
        let scratch = Scratch::new(&format!("g-rorec{case}"));
        let mut agent = Agent::start(&scratch, AgentOpts::default()).await;
        let (vol, staging) = staged_block(&agent, "r", Mode::SingleNodeWriter).await;
        let _overlays = Overlays(vol.device.clone());
        let t = target(&agent, "r");
        agent
            .node()
            .await
            .node_publish_volume(publish_req(
                &vol,
                &staging,
                &t,
                block_cap(Mode::SingleNodeWriter),
                true,
            ))
            .await
            .expect("publish readonly");
        check_read_only(&vol, &t);
        agent.terminate().await.expect("the agent stops");

        match case {
            "zero-byte" => std::fs::File::create(agent.state_dir.join("state.redb"))
                .map(drop)
                .expect("cut the state file to 0 bytes"),
            how => drop(agent.recover(how)),
        }
        if let Err(refused) = start_again(&mut agent).await {
            assert_eq!(case, "zero-byte", "{case}: {refused}");
            assert_eq!(loops_over(&vol.device).len(), 1, "{case}: {refused}");
            agent.kill();
            agent.recover("--reset");
            start_again(&mut agent).await.expect("start after reset");
        }
        assert_eq!(
            loops_over(&vol.device).len(),
            1,
            "{case}: the live read-only device was detached at start\n{}",
            agent.log_text()
        );
        assert_eq!(
            head(&t),
            vec![PATTERN; 4096],
            "{case}: the workload's device reads otherwise"
        );
        if case == "--from-mounts" {
            // The publication was rebuilt with its device: unpublish takes both down.
            agent
                .node()
                .await
                .node_unpublish_volume(unpublish_req(&vol, &t))
                .await
                .unwrap_or_else(|e| panic!("unpublish: {e:?}\n{}", agent.log_text()));
            assert!(!is_mounted(&t));
            assert_eq!(
                loops_over(&vol.device),
                Vec::<String>::new(),
                "unpublish left the rebuilt publication's device\n{}",
                agent.log_text()
            );
        }
    }
}

/// A mount namespace pinned to a file, with no process in it (`unshare --mount=<file>`): the
/// place a workload's binds live while its agent is stopped, seen by no other agent.
struct PinnedNs(PathBuf);

impl PinnedNs {
    /// In `dir` (made a private bind of itself, as unshare asks), with `real` bound at `at`.
    fn new(dir: &Path, name: &str, real: &Path, at: &Path) -> PinnedNs {
        let file = dir.join(name);
        std::fs::write(&file, b"").unwrap();
        let ns = PinnedNs(file);
        ns.run(&format!(
            "unshare --mount='{f}' --propagation private true",
            f = ns.0.display()
        ));
        // Its copies of the other tests' mounts go at once (see `drop_other_tests_mounts`).
        let script = dir.join(format!("{name}.drop-copies.sh"));
        std::fs::write(&script, drop_other_tests_mounts(dir)).unwrap();
        ns.run(&format!(
            "nsenter --mount='{}' -- sh '{}'",
            ns.0.display(),
            script.display()
        ));
        ns.inside(&format!(
            "mount --bind '{}' '{}'",
            real.display(),
            at.display()
        ));
        ns
    }

    fn run(&self, script: &str) -> std::process::Output {
        let out = sh(script);
        assert!(
            out.status.success(),
            "{script}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    fn inside(&self, script: &str) -> std::process::Output {
        self.run(&format!(
            "nsenter --mount='{}' -- sh -c \"{script}\"",
            self.0.display()
        ))
    }

    fn wrapper(&self) -> Vec<std::ffi::OsString> {
        vec![
            "nsenter".into(),
            format!("--mount={}", self.0.display()).into(),
            "--".into(),
        ]
    }
}

impl Drop for PinnedNs {
    fn drop(&mut self) {
        // The namespace (and every mount in it) goes with its last reference.
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// Detaches a loop device on drop.
struct DetachOnDrop(String);

impl Drop for DetachOnDrop {
    fn drop(&mut self) {
        detach_loop(Path::new(&self.0));
    }
}

#[tokio::test]
async fn one_state_path_in_two_namespaces_never_shares_read_only_devices() {
    // Makes a mount namespace, which copies every test's mounts: alone (see main.rs).
    let _ns = crate::NAMESPACE_COPY.write().await;
    if !require_root("one_state_path_in_two_namespaces_never_shares_read_only_devices") {
        return;
    }
    let scratch = Scratch::new("g-rons");
    let nsdir = scratch.join("ns");
    std::fs::create_dir_all(&nsdir).unwrap();
    sh(&format!(
        "mount --bind '{d}' '{d}' && mount --make-private '{d}'",
        d = nsdir.display()
    ));
    // One state path (scratch/state), two state directories behind it.
    let (real_a, real_b) = (scratch.join("real-a"), scratch.join("real-b"));
    let mut a = Agent::unstarted(&scratch, AgentOpts::default());
    for d in [&real_a, &real_b, &a.state_dir] {
        std::fs::create_dir_all(d).unwrap();
    }
    let ns_a = PinnedNs::new(&nsdir, "a", &real_a, &a.state_dir);
    let ns_b = PinnedNs::new(&nsdir, "b", &real_b, &a.state_dir);
    a.wrapper = ns_a.wrapper();
    a.spawn().await;
    let (vol, staging) = staged_block(&a, "ns", Mode::SingleNodeWriter).await;
    // Dropped before the namespaces: once they are gone, the volume's file is out of the
    // scratch's sight (its path is then relative to a detached mount).
    let _volume = DetachOnDrop(vol.device.clone());
    let _overlays = Overlays(vol.device.clone());
    let t = target(&a, "ns");
    a.node()
        .await
        .node_publish_volume(publish_req(
            &vol,
            &staging,
            &t,
            block_cap(Mode::SingleNodeWriter),
            true,
        ))
        .await
        .expect("publish readonly");
    let read_in_a = || {
        ns_a.inside(&format!(
            "dd if='{}' bs=4096 count=1 status=none",
            t.display()
        ))
        .stdout
    };
    assert_eq!(read_in_a(), vec![PATTERN; 4096]);
    // A stops (an upgrade, a crash loop); its workload's bind stays in its namespace.
    a.terminate().await.expect("agent a stops");

    let mut b = Agent::unstarted(&scratch, AgentOpts::default());
    b.socket = scratch.join("run-b/csi.sock");
    b.work = scratch.join("w-b");
    b.log = scratch.join("agent-b.log");
    b.wrapper = ns_b.wrapper();
    b.spawn().await;
    assert_eq!(
        loops_over(&vol.device).len(),
        1,
        "the other agent's start detached a live read-only device\n{}",
        b.log_text()
    );
    assert_eq!(
        read_in_a(),
        vec![PATTERN; 4096],
        "the workload's device reads otherwise"
    );
    b.terminate().await;
    // The guards go in reverse order: the devices while the namespaces still show their paths.
}

/// The workload's copy of the bind, in its own namespace, is all that is left of the
/// publication (the agent's bind was unmounted in the agent's namespace only), and the state
/// was reset: the next start still finds that bind and keeps the device.
#[tokio::test]
async fn a_bind_only_another_namespace_shows_keeps_its_device() {
    // Makes a mount namespace, which copies every test's mounts: alone (see main.rs).
    let _ns = crate::NAMESPACE_COPY.write().await;
    if !require_root("a_bind_only_another_namespace_shows_keeps_its_device") {
        return;
    }
    let scratch = Scratch::new("g-roother");
    let mut agent = Agent::start(&scratch, AgentOpts::default()).await;
    let (vol, staging) = staged_block(&agent, "o", Mode::SingleNodeWriter).await;
    let _overlays = Overlays(vol.device.clone());
    let t = target(&agent, "o");
    agent
        .node()
        .await
        .node_publish_volume(publish_req(
            &vol,
            &staging,
            &t,
            block_cap(Mode::SingleNodeWriter),
            true,
        ))
        .await
        .expect("publish readonly");
    let sleeper = Reaped(
        Command::new("unshare")
            .args(["-m", "--propagation", "private", "sh", "-c"])
            .arg(format!(
                "{}; exec sleep 300",
                drop_other_tests_mounts(&scratch.path)
            ))
            .spawn()
            .expect("unshare"),
    );
    let theirs =
        PathBuf::from(format!("/proc/{}/root", sleeper.0.id())).join(t.strip_prefix("/").unwrap());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::fs::read_to_string(format!("/proc/{}/mountinfo", sleeper.0.id()))
        .map_or(true, |m| !m.contains(&*t.to_string_lossy()))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the namespace never showed the bind"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    agent.terminate().await.expect("the agent stops");
    nix::mount::umount2(&t, nix::mount::MntFlags::MNT_DETACH).expect("unmount ours");
    agent.recover("--reset");
    start_again(&mut agent).await.expect("start after reset");
    assert_eq!(
        loops_over(&vol.device).len(),
        1,
        "a device bound in another namespace was detached\n{}",
        agent.log_text()
    );
    assert_eq!(
        head(&theirs),
        vec![PATTERN; 4096],
        "the workload's device reads otherwise"
    );
    drop(sleeper);
}

/// Tags outlive the binary: a read-only device an agent laid before instance ids (its tag a hash
/// of the state file's path) is still this agent's after the upgrade: start-up keeps it, and
/// unpublish detaches it.
#[tokio::test]
async fn a_device_laid_before_instance_ids_is_still_the_agents() {
    let _ns = crate::NAMESPACE_COPY.read().await;
    if !require_root("a_device_laid_before_instance_ids_is_still_the_agents") {
        return;
    }
    let scratch = Scratch::new("g-rolegacy");
    let mut agent = Agent::start(&scratch, AgentOpts::default()).await;
    let (vol, staging) = staged_block(&agent, "l", Mode::SingleNodeWriter).await;
    let _overlays = Overlays(vol.device.clone());
    let t = target(&agent, "l");
    let publish = publish_req(&vol, &staging, &t, block_cap(Mode::SingleNodeWriter), true);
    agent
        .node()
        .await
        .node_publish_volume(publish)
        .await
        .expect("publish readonly");
    agent.terminate().await.expect("the agent stops");
    // What the agent before instance ids left: the same publication, its device under the
    // state path's tag.
    nix::mount::umount2(&t, nix::mount::MntFlags::MNT_DETACH).expect("unmount");
    for dev in loops_over(&vol.device) {
        detach_loop(Path::new(&dev));
    }
    assert_eq!(loops_over(&vol.device), Vec::<String>::new());
    let legacy = ebs_node_core::node::ro_tag::AgentTag::new(0, &agent.state_dir.join("state.redb"))
        .legacy_tag(&vol.id, &t);
    let backing = std::fs::File::open(&vol.device).expect("open the volume's device");
    let old = ebs_node_host::loopdev::overlay::attach_read_only_over(backing, &legacy)
        .expect("lay a device as the agent before did");
    let out = sh(&format!(
        "mount --bind '{}' '{}'",
        old.display(),
        t.display()
    ));
    assert!(out.status.success(), "{out:?}");

    start_again(&mut agent).await.expect("start");
    assert_eq!(
        loops_over(&vol.device),
        vec![old.display().to_string()],
        "start-up did not keep the device laid before\n{}",
        agent.log_text()
    );
    check_read_only(&vol, &t);
    agent
        .node()
        .await
        .node_unpublish_volume(unpublish_req(&vol, &t))
        .await
        .unwrap_or_else(|e| panic!("unpublish: {e:?}\n{}", agent.log_text()));
    assert_eq!(
        loops_over(&vol.device),
        Vec::<String>::new(),
        "unpublish left the device laid before instance ids\n{}",
        agent.log_text()
    );
}
