//! Issue 23: hostile paths and careless COs. Paths are confined strictly below their prefixes,
//! away from the agent's own directories and from other volumes' paths; they are resolved and
//! used through file descriptors, so swapping a component for a symlink between check and use
//! redirects nothing; one operation per path at a time, whatever the volume.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ebs_tests::csi_req::*;
use ebs_tests::hung_mount::HungMount;
use ebs_tests::*;

use csi::volume_capability::access_mode::Mode;
use tonic::Code;

const MIB: i64 = 1 << 20;

fn ext4() -> csi::VolumeCapability {
    mount_cap("ext4", Mode::SingleNodeMultiWriter)
}

async fn staged(agent: &Agent, name: &str) -> (Vol, PathBuf) {
    let vol = create_attached(agent, name, 32 * MIB).await;
    let staging = agent.work.join(format!("staging/{name}"));
    agent
        .node()
        .await
        .node_stage_volume(stage_req(&vol, &staging, ext4()))
        .await
        .expect("stage");
    (vol, staging)
}

#[tokio::test]
async fn prefixes_and_the_agents_own_directories_are_never_paths() {
    if !require_root("prefixes_and_the_agents_own_directories_are_never_paths") {
        return;
    }
    let scratch = Scratch::new("conf-prefix");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let vol = create_attached(&agent, "v", 32 * MIB).await;
    let mut node = agent.node().await;
    let state_file = agent.state_dir.join("state.redb");
    for path in [
        agent.work.clone(),
        scratch.path.clone(),
        agent.state_dir.clone(),
        agent.state_dir.join("staging/v"),
        agent.socket.parent().unwrap().to_path_buf(),
    ] {
        let e = node
            .node_stage_volume(stage_req(&vol, &path, ext4()))
            .await
            .expect_err("refused");
        assert_eq!(e.code(), Code::InvalidArgument, "{}: {e:?}", path.display());
    }
    // A block publication onto the agent's own state file.
    let staging = agent.work.join("staging/b");
    let cap = block_cap(Mode::SingleNodeWriter);
    node.node_stage_volume(stage_req(&vol, &staging, cap.clone()))
        .await
        .unwrap();
    let before = checksum(&state_file);
    let e = node
        .node_publish_volume(publish_req(&vol, &staging, &state_file, cap, false))
        .await
        .expect_err("the state file is no target");
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(mounts_below(&scratch.path).is_empty(), "nothing mounted");
    drop(agent);
    assert_eq!(checksum(&state_file), before);
}

/// Binds `from` at `to` (made first); the scratch directory's clean-up unmounts it.
fn bind_alias(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    sh(&format!(
        "mount --bind '{}' '{}'",
        from.display(),
        to.display()
    ));
}

/// Issue 49: the shipped DaemonSet gave the socket directory a second name below the allowed
/// prefix (`/csi` is also `/var/lib/kubelet/plugins/<driver>`). A place is what it is, not what
/// it is called: a bind of the socket or state directory below the prefix is that directory.
#[tokio::test]
async fn a_second_name_of_the_agents_own_directories_is_never_a_path() {
    if !require_root("a_second_name_of_the_agents_own_directories_is_never_a_path") {
        return;
    }
    let scratch = Scratch::new("conf-alias-own");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let vol = create_attached(&agent, "v", 32 * MIB).await;
    let socket_dir = agent.socket.parent().unwrap().to_path_buf();
    let socket_alias = agent.work.join("plugins/ebs.csi.aws.com");
    let state_alias = agent.work.join("state-alias");
    bind_alias(&socket_dir, &socket_alias);
    bind_alias(&agent.state_dir, &state_alias);
    let mut node = agent.node().await;
    for path in [
        socket_alias.join("x"),
        socket_alias.join("a/b"),
        socket_alias.clone(),
        state_alias.join("staging/v"),
        state_alias.clone(),
    ] {
        let e = node
            .node_stage_volume(stage_req(&vol, &path, ext4()))
            .await
            .expect_err("a second name of the agent's own directory is refused");
        assert_eq!(e.code(), Code::InvalidArgument, "{}: {e:?}", path.display());
    }
    let staging = agent.work.join("staging/v");
    node.node_stage_volume(stage_req(&vol, &staging, ext4()))
        .await
        .expect("stage");
    let e = node
        .node_publish_volume(publish_req(
            &vol,
            &staging,
            &socket_alias.join("pod/mount"),
            ext4(),
            false,
        ))
        .await
        .expect_err("nor is a target inside it");
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    let mut mounted = mounts_below(&agent.work);
    mounted.sort();
    let mut want = vec![socket_alias.clone(), staging.clone(), state_alias.clone()];
    want.sort();
    assert_eq!(mounted, want, "nothing mounted in the agent's directories");
    assert!(!socket_dir.join("x").exists() && !socket_dir.join("pod").exists());
    assert!(!agent.state_dir.join("staging").exists());
    node.node_unstage_volume(unstage_req(&vol, &staging))
        .await
        .unwrap();
}

/// Issue 49: through a bind alias of volume A's staging path, volume B was staged inside A's
/// filesystem (nesting compared names). The directory a path lies in is on A's device: A's.
#[tokio::test]
async fn a_volumes_paths_never_nest_in_anothers_through_an_alias() {
    if !require_root("a_volumes_paths_never_nest_in_anothers_through_an_alias") {
        return;
    }
    let scratch = Scratch::new("conf-alias-nest");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let (a, a_staging) = staged(&agent, "a").await;
    let b = create_attached(&agent, "b", 32 * MIB).await;
    let alias = agent.work.join("alias-of-a");
    bind_alias(&a_staging, &alias);
    let mut node = agent.node().await;
    let e = node
        .node_stage_volume(stage_req(&b, &alias.join("b"), ext4()))
        .await
        .expect_err("b's staging path never lies in a's filesystem");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    let b_staging = agent.work.join("staging/b");
    node.node_stage_volume(stage_req(&b, &b_staging, ext4()))
        .await
        .unwrap();
    for (vol, staging) in [(&b, &b_staging), (&a, &a_staging)] {
        let target = alias.join("pod/mount");
        let e = node
            .node_publish_volume(publish_req(vol, staging, &target, ext4(), false))
            .await
            .expect_err("no target lies in a's filesystem");
        assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    }
    assert!(
        !a_staging.join("b").exists() && !a_staging.join("pod").exists(),
        "nothing written into a"
    );
    assert_eq!(mounts_below(&a_staging), vec![a_staging.clone()]);
    sh(&format!("umount '{}'", alias.display()));
    for (vol, staging) in [(&a, &a_staging), (&b, &b_staging)] {
        node.node_unstage_volume(unstage_req(vol, staging))
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn a_block_target_is_a_file_the_agent_creates() {
    if !require_root("a_block_target_is_a_file_the_agent_creates") {
        return;
    }
    let scratch = Scratch::new("conf-block-file");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let vol = create_attached(&agent, "v", 32 * MIB).await;
    let staging = agent.work.join("staging/v");
    let cap = block_cap(Mode::SingleNodeWriter);
    let mut node = agent.node().await;
    node.node_stage_volume(stage_req(&vol, &staging, cap.clone()))
        .await
        .unwrap();
    // A host file below the prefix, as kubelet's config.yaml is below /var/lib/kubelet.
    let config = agent.work.join("config.yaml");
    std::fs::write(&config, b"kind: KubeletConfiguration\n").unwrap();
    let e = node
        .node_publish_volume(publish_req(&vol, &staging, &config, cap.clone(), false))
        .await
        .expect_err("an existing file is not the agent's to cover");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(mounts_below(&agent.work).is_empty());
    // Unpublish of it (no such publication) leaves it too.
    node.node_unpublish_volume(unpublish_req(&vol, &config))
        .await
        .unwrap();
    assert_eq!(
        std::fs::read(&config).unwrap(),
        b"kind: KubeletConfiguration\n"
    );
    // A target the agent creates itself works, and a retry reuses it.
    let target = agent.work.join("pods/p/dev");
    std::fs::create_dir_all(target.parent().unwrap()).unwrap();
    for _ in 0..2 {
        node.node_publish_volume(publish_req(&vol, &staging, &target, cap.clone(), false))
            .await
            .unwrap();
    }
    node.node_unpublish_volume(unpublish_req(&vol, &target))
        .await
        .unwrap();
    assert!(!target.exists());
}

#[tokio::test]
async fn a_volumes_paths_never_nest_in_anothers() {
    if !require_root("a_volumes_paths_never_nest_in_anothers") {
        return;
    }
    let scratch = Scratch::new("conf-nest");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let (a, a_staging) = staged(&agent, "a").await;
    let b = create_attached(&agent, "b", 32 * MIB).await;
    let mut node = agent.node().await;
    let b_staging = agent.work.join("staging/b");
    node.node_stage_volume(stage_req(&b, &b_staging, ext4()))
        .await
        .unwrap();
    std::fs::write(a_staging.join("a-data"), b"a").unwrap();
    for target in [
        a_staging.join("inside"),
        a_staging.clone(),
        agent.work.join("staging"),
    ] {
        let e = node
            .node_publish_volume(publish_req(&b, &b_staging, &target, ext4(), false))
            .await
            .expect_err("b's target never lies in or over a's staging path");
        assert_eq!(
            e.code(),
            Code::FailedPrecondition,
            "{}: {e:?}",
            target.display()
        );
    }
    let e = node
        .node_stage_volume(stage_req(&b, &a_staging.join("x"), ext4()))
        .await
        .expect_err("nor does its staging path");
    assert!(
        matches!(e.code(), Code::FailedPrecondition | Code::AlreadyExists),
        "{e:?}"
    );
    assert!(!a_staging.join("inside").exists(), "nothing written into a");
    assert_eq!(mounts_below(&a_staging), vec![a_staging.clone()]);
    let _ = a;
}

#[tokio::test]
async fn two_volumes_racing_for_one_path_never_stack() {
    if !require_root("two_volumes_racing_for_one_path_never_stack") {
        return;
    }
    let scratch = Scratch::new("conf-race-ids");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let a = create_attached(&agent, "a", 32 * MIB).await;
    let b = create_attached(&agent, "b", 32 * MIB).await;
    let path = agent.work.join("staging/shared");
    for round in 0..6 {
        let (mut na, mut nb) = (agent.node().await, agent.node().await);
        let (ra, rb) = tokio::join!(
            na.node_stage_volume(stage_req(&a, &path, ext4())),
            nb.node_stage_volume(stage_req(&b, &path, ext4())),
        );
        let mounted = mounts_below(&path);
        assert!(
            mounted.len() <= 1,
            "round {round}: stacked mounts {mounted:?}"
        );
        assert!(
            !(ra.is_ok() && rb.is_ok()),
            "round {round}: both volumes staged at one path"
        );
        for (vol, r) in [(&a, ra), (&b, rb)] {
            if r.is_ok() {
                na.node_unstage_volume(unstage_req(vol, &path))
                    .await
                    .unwrap();
            }
        }
        assert!(mounts_below(&path).is_empty(), "round {round}");
    }
}

/// Swaps `dir` and `link` (a symlink to a decoy outside every prefix) atomically, as fast as it
/// can, until dropped (also when the test fails, so the scratch directory can be removed).
struct Swapper {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<u64>>,
}

impl Swapper {
    fn start(dir: PathBuf, link: PathBuf) -> Swapper {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = swapper(dir, link, Arc::clone(&stop));
        Swapper {
            stop,
            thread: Some(thread),
        }
    }

    fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .map(|t| t.join().unwrap_or(0))
            .unwrap_or(0)
    }
}

impl Drop for Swapper {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn swapper(dir: PathBuf, link: PathBuf, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut swaps = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let _ = nix::fcntl::renameat2(
                nix::fcntl::AT_FDCWD,
                &dir,
                nix::fcntl::AT_FDCWD,
                &link,
                nix::fcntl::RenameFlags::RENAME_EXCHANGE,
            );
            swaps += 1;
        }
        swaps
    })
}

fn empty(dir: &Path) -> bool {
    std::fs::read_dir(dir)
        .map(|mut d| d.next().is_none())
        .unwrap_or(true)
}

#[tokio::test]
async fn a_symlink_swapped_in_between_check_and_use_redirects_nothing() {
    if !require_root("a_symlink_swapped_in_between_check_and_use_redirects_nothing") {
        return;
    }
    swap_race("conf-swap", Vec::new()).await;
}

/// The same race where a seccomp filter denies openat2 (EPERM, as systemd before 248 answered
/// under RestrictSUIDSGID=): the step-by-step walk the agent falls back to is as confined.
#[tokio::test]
async fn a_symlink_swapped_in_redirects_nothing_without_openat2_either() {
    if !require_root("a_symlink_swapped_in_redirects_nothing_without_openat2_either") {
        return;
    }
    use ebs_tests::seccomp::*;
    swap_race("conf-swap-walk", filtered(&unit_like(EPERM))).await;
}

async fn swap_race(name: &str, wrapper: Vec<std::ffi::OsString>) {
    let scratch = Scratch::new(name);
    let mut agent = Agent::unstarted(&scratch, AgentOpts::default());
    agent.wrapper = wrapper;
    agent.spawn().await;
    let (vol, staging) = staged(&agent, "v").await;
    let decoy = scratch.join("decoy");
    std::fs::create_dir_all(&decoy).unwrap();
    let race = agent.work.join("race");
    std::fs::create_dir_all(race.join("d")).unwrap();
    std::os::unix::fs::symlink(&decoy, race.join("d-swap")).unwrap();
    let swaps = Swapper::start(race.join("d"), race.join("d-swap"));
    let mut node = agent.node().await;
    let (mut ok, mut refused) = (0, 0);
    for i in 0..300 {
        let target = race.join(format!("d/pod{}/mount", i % 10));
        match node
            .node_publish_volume(publish_req(&vol, &staging, &target, ext4(), false))
            .await
        {
            Ok(_) => ok += 1,
            Err(_) => refused += 1,
        }
        let _ = node
            .node_unpublish_volume(unpublish_req(&vol, &target))
            .await;
        assert!(
            mounts_below(&decoy).is_empty(),
            "call {i}: a mount landed in the decoy"
        );
        assert!(
            empty(&decoy),
            "call {i}: something was created in the decoy"
        );
        for pod in 0..10 {
            let stacked = mounts_at_pod(&race, pod);
            assert!(
                stacked <= 1,
                "call {i}: {stacked} mounts at pod{pod}/mount: a publish stacked on the volume's \
                 own publication"
            );
        }
    }
    let swaps = swaps.finish();
    eprintln!("{ok} publishes succeeded, {refused} refused, {swaps} swaps");
    assert!(swaps > 1000, "the swapper ran");
    // Leave nothing mounted below the race directory either: detached, so that a mount a
    // shared `/` propagated (or one a failed unpublish left) never fails the clean-up.
    for _ in 0..3 {
        for target in mounts_below(&race) {
            let _ = nix::mount::umount2(&target, nix::mount::MntFlags::MNT_DETACH);
        }
    }
    assert!(mounts_below(&race).is_empty(), "{:?}", mounts_below(&race));
}

/// How many mounts this namespace shows at one race target, whatever the name its directory
/// has at the moment (`d` or `d-swap`): the same volume bound twice there is a stack.
fn mounts_at_pod(race: &Path, pod: usize) -> usize {
    let tail = PathBuf::from(format!("pod{pod}/mount"));
    mounts_below(race)
        .iter()
        .filter(|m| {
            m.strip_prefix(race)
                .ok()
                .and_then(|rest| rest.strip_prefix("d").or(rest.strip_prefix("d-swap")).ok())
                == Some(tail.as_path())
        })
        .count()
}

#[tokio::test]
async fn a_path_that_cannot_be_examined_is_refused() {
    if !require_root("a_path_that_cannot_be_examined_is_refused") {
        return;
    }
    if !Path::new("/dev/fuse").exists() {
        assert_ne!(
            std::env::var("CI").as_deref(),
            Ok("true"),
            "no /dev/fuse under CI"
        );
        skip("a_path_that_cannot_be_examined_is_refused", "no /dev/fuse");
        return;
    }
    let scratch = Scratch::new("conf-dead");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let (vol, staging) = staged(&agent, "v").await;
    let mut dead = HungMount::new(&agent.work.join("dead")).expect("FUSE mount");
    dead.abort();
    let target = agent.work.join("dead/pod/mount");
    let mut node = agent.node().await;
    let e = node
        .node_publish_volume(publish_req(&vol, &staging, &target, ext4(), false))
        .await
        .expect_err("below a dead mount nothing can be proven");
    assert!(
        matches!(e.code(), Code::FailedPrecondition | Code::InvalidArgument),
        "{e:?}"
    );
    let r = node
        .node_unpublish_volume(unpublish_req(&vol, &target))
        .await;
    assert!(
        r.is_err(),
        "an unpublish that cannot look must not answer OK: {r:?}"
    );
    tokio::time::sleep(Duration::from_millis(10)).await;
    dead.release();
}
