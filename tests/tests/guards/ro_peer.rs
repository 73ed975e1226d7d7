//! A read-only publication is read-only in every mount namespace its bind propagates to. With
//! Bidirectional propagation (the DaemonSet's kubelet directory is a shared mount) the agent's
//! bind is cloned into the host's namespace; the clone must carry `ro` and the requested
//! nosuid/nodev/noexec bits too, or the host (and every pod that mounts the path from there)
//! writes into a volume published read-only. The test makes a shared tmpfs inside the agent's
//! allowed prefix and a second peer of it outside, publishes below the first and looks at the
//! copy in the second.

use std::path::Path;

use ebs_tests::csi_req::*;
use ebs_tests::*;

use csi::volume_capability::access_mode::Mode;

use super::{MIB, is_mounted};

/// The options (the per-mount ones, mountinfo's 6th field) of the mount exactly at `path`.
pub(super) fn mount_options(path: &Path) -> Option<Vec<String>> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let wanted = path.to_string_lossy();
    text.lines()
        .rfind(|l| l.split(' ').nth(4) == Some(&*wanted))
        .and_then(|l| l.split(' ').nth(5))
        .map(|o| o.split(',').map(str::to_string).collect())
}

/// A write through `path` fails with EROFS (not merely with some error).
fn erofs(path: &Path) -> Result<(), String> {
    match std::fs::write(path, b"through a peer") {
        Err(e) if e.raw_os_error() == Some(libc::EROFS) => Ok(()),
        Err(e) => Err(format!("{} failed otherwise: {e}", path.display())),
        Ok(()) => Err(format!("{} was writable", path.display())),
    }
}

/// `shared`, a tmpfs made a shared mount, and `peer`, a bind of it (so in its peer group):
/// whatever is mounted below one appears below the other. Scratch's drop unmounts both.
pub(super) fn shared_pair(shared: &Path, peer: &Path) {
    std::fs::create_dir_all(shared).unwrap();
    std::fs::create_dir_all(peer).unwrap();
    sh(&format!(
        "mount -t tmpfs -o size=4m ebs-ropeer '{s}' && mount --make-private '{s}' && \
         mount --make-shared '{s}' && mount --bind '{s}' '{p}'",
        s = shared.display(),
        p = peer.display()
    ));
}

#[tokio::test]
async fn a_read_only_publish_is_read_only_in_every_peer_namespace() {
    let _ns = crate::NAMESPACE_COPY.read().await;
    if !require_root("a_read_only_publish_is_read_only_in_every_peer_namespace") {
        return;
    }
    let scratch = Scratch::new("g-ropeer");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let shared = agent.work.join("pods");
    let peer = scratch.join("peer");
    shared_pair(&shared, &peer);
    let vol = create_attached(&agent, "rop", 64 * MIB).await;
    let staging = agent.work.join("staging/rop");
    let mut node = agent.node().await;
    node.node_stage_volume(stage_req(
        &vol,
        &staging,
        mount_cap("ext4", Mode::SingleNodeWriter),
    ))
    .await
    .expect("stage");
    std::fs::write(staging.join("hello"), b"staged").unwrap();

    // readonly=true with noexec and nosuid; then noexec alone, read-write (the other bits must
    // reach the peer too); then `ro` among the flags.
    let cases: [(&str, &[&str], bool); 3] = [
        ("a", &["noexec", "nosuid"], true),
        ("b", &["noexec"], false),
        ("c", &["ro", "nodev"], false),
    ];
    for (name, flags, readonly) in cases {
        let target = shared.join(format!("{name}/mount"));
        let seen = peer.join(format!("{name}/mount"));
        let cap = mount_cap_flags("ext4", Mode::SingleNodeWriter, flags);
        node.node_publish_volume(publish_req(&vol, &staging, &target, cap, readonly))
            .await
            .unwrap_or_else(|e| panic!("publish {name}: {e:?}\n{}", agent.log_text()));
        assert!(
            is_mounted(&seen),
            "the bind did not propagate to {}",
            seen.display()
        );
        let ro = readonly || flags.contains(&"ro");
        for at in [&target, &seen] {
            let opts = mount_options(at).expect("in mountinfo");
            let want: Vec<&str> = flags
                .iter()
                .copied()
                .filter(|f| *f != "ro")
                .chain([if ro { "ro" } else { "rw" }])
                .collect();
            for w in want {
                assert!(
                    opts.iter().any(|o| o == w),
                    "{} lacks {w}: {opts:?}",
                    at.display()
                );
            }
            assert_eq!(std::fs::read(at.join("hello")).unwrap(), b"staged");
            if ro {
                erofs(&at.join("x")).unwrap();
            }
        }
        std::fs::write(staging.join("still-rw"), b"x").expect("the staging mount stays writable");
        // One publication at a time: the access mode is single-node-writer.
        node.node_unpublish_volume(unpublish_req(&vol, &target))
            .await
            .expect("unpublish");
        assert!(
            mounts_below(&peer).iter().all(|m| m == &peer),
            "the unpublish left copies: {:?}",
            mounts_below(&peer)
        );
    }
    node.node_unstage_volume(unstage_req(&vol, &staging))
        .await
        .expect("unstage");
}

/// A read-only raw block publication under a shared mount: the bind of the read-only loop
/// device reaches the peer, and a write through the peer's copy fails too.
#[tokio::test]
async fn a_read_only_block_publish_is_read_only_in_a_peer() {
    let _ns = crate::NAMESPACE_COPY.read().await;
    if !require_root("a_read_only_block_publish_is_read_only_in_a_peer") {
        return;
    }
    let scratch = Scratch::new("g-ropeerblk");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let shared = agent.work.join("pods");
    let peer = scratch.join("peer");
    shared_pair(&shared, &peer);
    let vol = create_attached(&agent, "ropb", 16 * MIB).await;
    let staging = agent.work.join("staging/ropb");
    let cap = block_cap(Mode::SingleNodeWriter);
    let mut node = agent.node().await;
    node.node_stage_volume(stage_req(&vol, &staging, cap.clone()))
        .await
        .expect("stage");
    let target = shared.join("dev");
    let seen = peer.join("dev");
    node.node_publish_volume(publish_req(&vol, &staging, &target, cap, true))
        .await
        .unwrap_or_else(|e| panic!("publish: {e:?}\n{}", agent.log_text()));
    assert!(is_mounted(&seen), "the bind did not propagate");
    for at in [&target, &seen] {
        let opts = mount_options(at).expect("in mountinfo");
        assert!(opts.iter().any(|o| o == "ro"), "{}: {opts:?}", at.display());
        super::write_fails(at).unwrap();
    }
    node.node_unpublish_volume(unpublish_req(&vol, &target))
        .await
        .expect("unpublish");
    assert!(!is_mounted(&seen), "the unpublish left the peer's copy");
    node.node_unstage_volume(unstage_req(&vol, &staging))
        .await
        .expect("unstage");
}

/// Without mount_setattr (a kernel before 5.12: ENOSYS) the bind + remount fallback keeps every
/// guarantee it had in the agent's own namespace: read-only and noexec there, said once in the
/// log. (Its peers' copies: the next test.)
#[tokio::test]
async fn without_mount_setattr_the_fallback_is_read_only_in_the_agents_namespace() {
    let _ns = crate::NAMESPACE_COPY.read().await;
    if !require_root("without_mount_setattr_the_fallback_is_read_only_in_the_agents_namespace") {
        return;
    }
    use ebs_tests::seccomp::{ENOSYS, MOUNT_SETATTR, filtered};
    let scratch = Scratch::new("g-ropeerfb");
    let mut agent = Agent::unstarted(&scratch, AgentOpts::default());
    agent.wrapper = filtered(&[(MOUNT_SETATTR, ENOSYS)]);
    agent.spawn().await;
    let vol = create_attached(&agent, "ropf", 64 * MIB).await;
    let staging = agent.work.join("staging/ropf");
    let mut node = agent.node().await;
    node.node_stage_volume(stage_req(
        &vol,
        &staging,
        mount_cap("ext4", Mode::SingleNodeWriter),
    ))
    .await
    .expect("stage");
    let target = agent.work.join("pods/f/mount");
    let cap = mount_cap_flags("ext4", Mode::SingleNodeWriter, &["noexec"]);
    node.node_publish_volume(publish_req(&vol, &staging, &target, cap, true))
        .await
        .unwrap_or_else(|e| panic!("publish: {e:?}\n{}", agent.log_text()));
    let opts = mount_options(&target).expect("in mountinfo");
    assert!(
        opts.iter().any(|o| o == "ro") && opts.iter().any(|o| o == "noexec"),
        "{opts:?}"
    );
    erofs(&target.join("x")).unwrap();
    let log = agent.log_text();
    assert_eq!(
        log.lines()
            .filter(|l| l.contains("taking the fallback") && l.contains("mount_setattr"))
            .count(),
        1,
        "{log}"
    );
    node.node_unpublish_volume(unpublish_req(&vol, &target))
        .await
        .expect("unpublish");
    node.node_unstage_volume(unstage_req(&vol, &staging))
        .await
        .expect("unstage");
}

/// The same without the new mount API (a kernel before 5.12, or a seccomp filter denying it):
/// the fallback must not leave the peers' copies writable either (a remount does not
/// propagate), nor without the noexec asked for.
#[tokio::test]
async fn without_the_mount_api_a_read_only_publish_is_read_only_in_every_peer_too() {
    let _ns = crate::NAMESPACE_COPY.read().await;
    if !require_root("without_the_mount_api_a_read_only_publish_is_read_only_in_every_peer_too") {
        return;
    }
    use ebs_tests::seccomp::{ENOSYS, EPERM, MOUNT_SETATTR, MOVE_MOUNT, OPEN_TREE, filtered};
    let filters = [
        ("setattr", filtered(&[(MOUNT_SETATTR, ENOSYS)])),
        (
            "api",
            filtered(&[
                (OPEN_TREE, EPERM),
                (MOVE_MOUNT, EPERM),
                (MOUNT_SETATTR, EPERM),
            ]),
        ),
    ];
    for (name, wrapper) in filters {
        let scratch = Scratch::new(&format!("g-ropeerfb-{name}"));
        let mut agent = Agent::unstarted(&scratch, AgentOpts::default());
        agent.wrapper = wrapper;
        agent.spawn().await;
        let shared = agent.work.join("pods");
        let peer = scratch.join("peer");
        shared_pair(&shared, &peer);
        let vol = create_attached(&agent, "ropfp", 64 * MIB).await;
        let staging = agent.work.join("staging/ropfp");
        let mut node = agent.node().await;
        node.node_stage_volume(stage_req(
            &vol,
            &staging,
            mount_cap("ext4", Mode::SingleNodeWriter),
        ))
        .await
        .expect("stage");
        std::fs::write(staging.join("hello"), b"staged").unwrap();
        let cases: [(&str, &[&str], bool); 2] =
            [("a", &["noexec"], true), ("c", &["ro", "nodev"], false)];
        for (case, flags, readonly) in cases {
            let target = shared.join(format!("{case}/mount"));
            let seen = peer.join(format!("{case}/mount"));
            let cap = mount_cap_flags("ext4", Mode::SingleNodeWriter, flags);
            node.node_publish_volume(publish_req(&vol, &staging, &target, cap, readonly))
                .await
                .unwrap_or_else(|e| panic!("{name} publish {case}: {e:?}\n{}", agent.log_text()));
            assert!(is_mounted(&seen), "the bind did not propagate");
            for at in [&target, &seen] {
                let opts = mount_options(at).expect("in mountinfo");
                for w in flags.iter().filter(|f| **f != "ro").chain(&["ro"]) {
                    assert!(
                        opts.iter().any(|o| o == w),
                        "{name}: {} lacks {w}: {opts:?}",
                        at.display()
                    );
                }
                assert_eq!(std::fs::read(at.join("hello")).unwrap(), b"staged");
                erofs(&at.join("x")).unwrap();
            }
            std::fs::write(staging.join("still-rw"), b"x").expect("the staging mount stays rw");
            node.node_unpublish_volume(unpublish_req(&vol, &target))
                .await
                .expect("unpublish");
            assert!(
                mounts_below(&peer).iter().all(|m| m == &peer),
                "{name}: the unpublish left copies: {:?}",
                mounts_below(&peer)
            );
        }
        node.node_unstage_volume(unstage_req(&vol, &staging))
            .await
            .expect("unstage");

        // A read-only raw block publication: a device node bound through the private place.
        let vol = create_attached(&agent, "ropfb", 16 * MIB).await;
        let staging = agent.work.join("staging/ropfb");
        let cap = block_cap(Mode::SingleNodeWriter);
        node.node_stage_volume(stage_req(&vol, &staging, cap.clone()))
            .await
            .expect("block stage");
        let (target, seen) = (shared.join("dev"), peer.join("dev"));
        node.node_publish_volume(publish_req(&vol, &staging, &target, cap, true))
            .await
            .unwrap_or_else(|e| panic!("{name} block publish: {e:?}\n{}", agent.log_text()));
        assert!(is_mounted(&seen), "the block bind did not propagate");
        for at in [&target, &seen] {
            let opts = mount_options(at).expect("in mountinfo");
            assert!(
                opts.iter().any(|o| o == "ro"),
                "{name}: {}: {opts:?}",
                at.display()
            );
            super::write_fails(at).unwrap();
        }
        node.node_unpublish_volume(unpublish_req(&vol, &target))
            .await
            .expect("block unpublish");
        assert!(
            !is_mounted(&seen),
            "{name}: the unpublish left the peer's copy"
        );
        node.node_unstage_volume(unstage_req(&vol, &staging))
            .await
            .expect("block unstage");
    }
}
