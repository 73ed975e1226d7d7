//! Issue 49 (a ninth fresh review's F3): a device bound raw only in another mount namespace (a
//! container's bind of it, a pre-attached disk another driver handed out) is in raw use: a
//! node-local handle never takes it. The agent's own mount table does not show that bind.

use ebs_tests::csi_req::*;
use ebs_tests::elsewhere::{BoundElsewhere, EVERY_WAY, How};
use ebs_tests::*;

use std::process::Command;

use tonic::Code;

use super::owners::{DetachOnDrop, rwx_block};

#[tokio::test]
async fn a_device_bound_only_in_another_namespace_is_never_a_handles() {
    // Makes a mount namespace, which copies every test's mounts: alone (see main.rs).
    let _ns = crate::NAMESPACE_COPY.write().await;
    if !require_root("a_device_bound_only_in_another_namespace_is_never_a_handles") {
        return;
    }
    let scratch = Scratch::new("node-local-else");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    refused_in_every_way(&agent, &scratch, "listed").await;
    assert!(
        !agent.log_text().contains(WALKED),
        "this kernel lists its mount namespaces:\n{}",
        agent.log_text()
    );
    drop(agent);
    // As before Linux 6.12: no list of mount namespaces, so every process is walked.
    let mut agent = Agent::unstarted(&scratch, AgentOpts::default());
    agent.wrapper = ebs_tests::seccomp::without_namespace_list();
    agent.spawn().await;
    refused_in_every_way(&agent, &scratch, "walked").await;
    assert_eq!(
        agent.log_text().matches(WALKED).count(),
        1,
        "said once:\n{}",
        agent.log_text()
    );
}

/// What an agent that walks /proc for the mount namespaces says, once.
const WALKED: &str = "the kernel's list of mount namespaces is not taken here";

/// A handle's stage of a device that another namespace binds, in each way it can, is refused.
async fn refused_in_every_way(agent: &Agent, scratch: &Scratch, label: &str) {
    for how in EVERY_WAY {
        let disk = crate::Disk::new(scratch, &format!("d-{label}-{how:?}"), 64 << 20);
        sh(&format!(
            "printf OPERATOR-DATA | dd of={} bs=512 seek=100 conv=notrunc,fsync status=none",
            disk.dev.display()
        ));
        let theirs = BoundElsewhere::by(
            how,
            &scratch.path,
            &disk.dev,
            &scratch.join(&format!("ctr-{label}-{how:?}")),
        );
        let before = checksum(&disk.dev);
        let mounts = mounts_below(&agent.work);
        let e = disk.stage_handle(agent).await.expect_err(&format!(
            "{label} {how:?}: a handle took a device another namespace binds raw"
        ));
        assert_eq!(e.code(), Code::FailedPrecondition, "{label} {how:?}: {e:?}");
        // Told, not guessed: a bind no name tells is looked at with its covers off.
        assert!(
            !e.message().contains("cannot be told"),
            "{label} {how:?}: {}",
            e.message()
        );
        assert_eq!(before, checksum(&disk.dev), "the device's bytes changed");
        assert_eq!(mounts, mounts_below(&agent.work), "the host changed");
        drop(theirs);
    }
}

/// An agent in a PID namespace of its own (a pod without `hostPID`) cannot see the other
/// processes' mount namespaces, so it cannot know a device is free of binds: it refuses a
/// handle's block device, and says how to run it (an eleventh fresh review's F2).
#[tokio::test]
async fn an_agent_that_cannot_see_every_process_frees_and_takes_nothing() {
    let _shared = crate::NAMESPACE_COPY.read().await;
    if !require_root("an_agent_that_cannot_see_every_process_frees_and_takes_nothing") {
        return;
    }
    let scratch = Scratch::new("node-local-pidns");
    let mut agent = Agent::unstarted(&scratch, AgentOpts::default());
    agent.wrapper = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]
        .iter()
        .map(Into::into)
        .collect();
    agent.spawn().await;
    let disk = crate::Disk::new(&scratch, "d", 64 << 20);
    let e = agent
        .node()
        .await
        .node_stage_volume(stage_req(
            &disk.vol(),
            &agent.work.join("h/staging"),
            rwx_block(),
        ))
        .await
        .expect_err("a handle staged by an agent that cannot see every process");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("hostPID"), "{e:?}");
    assert!(mounts_below(&agent.work).is_empty(), "the host changed");
}

/// A loop device over the handle's file at an offset past its end has no size, and
/// /proc/partitions leaves it out; bound in another namespace, it is a view of the file all the
/// same: whoever may open it for writing moves its offset back (LOOP_SET_STATUS64 needs no
/// privilege) and reads and writes the staged filesystem through the bind (a thirty-fourth fresh
/// review's F2: the views walk listed only devices with a size).
#[tokio::test]
async fn a_sizeless_loop_device_over_the_file_bound_elsewhere_refuses_the_stage() {
    // Makes a mount namespace, which copies every test's mounts: alone (see main.rs).
    let _ns = crate::NAMESPACE_COPY.write().await;
    if !require_root("a_sizeless_loop_device_over_the_file_bound_elsewhere_refuses_the_stage") {
        return;
    }
    let scratch = Scratch::new("node-local-sizeless");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let img = scratch.join("v.img");
    sh(&format!("truncate -s {} {}", 32 << 20, img.display()));
    let dev = DetachOnDrop(super::losetup("", img.display()));
    let past = DetachOnDrop(super::losetup(&format!("-o {}", 32 << 20), img.display()));
    let theirs = BoundElsewhere::new(
        &scratch.path,
        std::path::Path::new(&past.0),
        &scratch.join("ctr-past"),
    );
    let h = Vol {
        id: format!("local-ebs://{}", dev.0.trim_start_matches('/')),
        device: dev.0.clone(),
    };
    let before = checksum(std::path::Path::new(&dev.0));
    super::siblings::both_stages_refused(
        &agent,
        &h,
        "a handle was staged under a sizeless view of its file bound elsewhere",
    )
    .await;
    assert_eq!(
        before,
        checksum(std::path::Path::new(&dev.0)),
        "the bytes changed"
    );
    drop(theirs);
}

/// A bind of a character device node removed since (an unplugged serial adapter a container
/// still binds) proves by its mount point that no block device is bound there: it blocks no
/// stage (a forty-sixth fresh review's F3: every stage was refused while it lived).
#[tokio::test]
async fn a_removed_character_device_bound_elsewhere_blocks_nothing() {
    let _ns = crate::NAMESPACE_COPY.write().await;
    if !require_root("a_removed_character_device_bound_elsewhere_blocks_nothing") {
        return;
    }
    let scratch = Scratch::new("node-local-chr");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let node = std::path::PathBuf::from(format!("/dev/ebs-test-chr-{}", std::process::id()));
    struct Gone(std::path::PathBuf);
    impl Drop for Gone {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    let _gone = Gone(node.clone());
    sh(&format!("mknod {} c 1 3", node.display()));
    let theirs = BoundElsewhere::new(&scratch.path, &node, &scratch.join("ctr-chr"));
    std::fs::remove_file(&node).expect("the node goes");
    let disk = crate::Disk::new(&scratch, "free", 64 << 20);
    if let Err(e) = disk.stage_handle(&agent).await {
        panic!("a free disk refused while a removed character device is bound elsewhere: {e:?}");
    }
    disk.unstage_handle(&agent).await.expect("unstage");
    drop(theirs);
}

/// A bind no name tells is looked at in the agent's own copy of its namespace, with the mounts
/// over it taken off there: never in the namespace itself, nor in its peers (its mounts shared:
/// an unmount in a copy that stayed their peer would reach them). Where the kernel keeps the
/// covers on, or where no path reaches the bind (renamed away), a node outside the device
/// filesystem cannot be told: every device counts as used until the bind goes.
#[tokio::test]
async fn covers_come_off_only_in_the_agents_own_copy() {
    let _ns = crate::NAMESPACE_COPY.write().await;
    if !require_root("covers_come_off_only_in_the_agents_own_copy") {
        return;
    }
    let scratch = Scratch::new("node-local-unveil");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    for (how, told) in [
        (How::MknodSharedCover, true),
        (How::MknodRenamedAway, false),
    ] {
        let disk = crate::Disk::new(&scratch, &format!("d-{how:?}"), 64 << 20);
        let theirs = BoundElsewhere::by(how, &scratch.path, &disk.dev, &scratch.join("ctr"));
        let before = theirs.mountinfo();
        let e = disk.stage_handle(&agent).await.expect_err(&format!(
            "{how:?}: a handle took a device bound under a cover"
        ));
        assert_eq!(e.code(), Code::FailedPrecondition, "{how:?}: {e:?}");
        assert_eq!(
            e.message().contains("cannot be told"),
            !told,
            "{how:?}: {}",
            e.message()
        );
        assert_eq!(
            before,
            theirs.mountinfo(),
            "{how:?}: the holder's mounts changed"
        );
        theirs.end();
        disk.stage_handle(&agent)
            .await
            .unwrap_or_else(|e| panic!("{how:?}: refused once the bind went: {e:?}"));
        disk.unstage_handle(&agent).await.expect("unstage");
    }
}

/// What any user can make in a namespace of its own user namespace (a plain file bound below a
/// cover, which the copy cannot take off there, and one renamed away) never refuses a free disk
/// (a fifty-first fresh review's F3: one `mv` refused every stage on the node).
#[tokio::test]
async fn a_users_own_namespace_never_refuses_a_free_disk() {
    let _ns = crate::NAMESPACE_COPY.write().await;
    if !require_root("a_users_own_namespace_never_refuses_a_free_disk") {
        return;
    }
    let scratch = Scratch::new("node-local-users");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let file = scratch.join("plain");
    std::fs::write(&file, b"plain").expect("a plain file");
    let theirs = BoundElsewhere::by(How::UsersOwn, &scratch.path, &file, &scratch.join("ctr"));
    // The whole /dev bound there (recursively: its submounts are locked) below a tmpfs: its root
    // is the device filesystem's own, a directory (a fifty-third fresh review's F1: every stage
    // on the node was refused).
    let u = scratch.join("u");
    std::fs::create_dir_all(u.join("a/x")).expect("the user's directory");
    let whole_dev = Command::new("unshare")
        .args(["-U", "-r", "-m", "--propagation", "private", "sh", "-c"])
        .arg(format!(
            "mount --rbind /dev '{u}/a/x' && mount -t tmpfs ebs-test-cover '{u}/a' && \
             exec sleep 600",
            u = u.display()
        ))
        .spawn()
        .expect("unshare");
    let whole_dev = Reaped(whole_dev);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::fs::read_to_string(format!("/proc/{}/mountinfo", whole_dev.0.id()))
        .map_or(true, |m| !m.contains(" - tmpfs ebs-test-cover "))
    {
        assert!(std::time::Instant::now() < deadline, "/dev was not bound");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let disk = crate::Disk::new(&scratch, "free", 64 << 20);
    if let Err(e) = disk.stage_handle(&agent).await {
        panic!("a free disk refused over a user's own namespace: {e:?}");
    }
    disk.unstage_handle(&agent).await.expect("unstage");
    drop(theirs);
    drop(whole_dev);
}

/// A node bound from a disconnected dentry on an XFS shut down since: the node cannot be asked
/// at its mount point (a stat fails there), and was passed over as a place renamed away; the
/// stage was accepted while the bind read and wrote the device (a fifty-third fresh review's
/// F3). It cannot be told, so every device counts as used until it goes.
#[tokio::test]
async fn a_node_bound_from_a_shut_down_filesystem_is_never_passed_over() {
    let test = "a_node_bound_from_a_shut_down_filesystem_is_never_passed_over";
    refused_until_the_bind_goes(test, "node-local-shutdown", How::DisconnectedShutDown).await;
}

/// A node of the device filesystem bound below a cover in a namespace of a user namespace of its
/// own, and deleted since (its device went: a detach): the agent's copy of that namespace has
/// every mount locked, so the cover stays on, and the name no longer tells the node. The next
/// disk given the number was staged, and the holder read that volume through its old bind (a
/// fifty-second fresh review's F1): now every device counts as used until the bind goes.
#[tokio::test]
async fn a_deleted_node_covered_in_a_users_namespace_keeps_its_number() {
    let test = "a_deleted_node_covered_in_a_users_namespace_keeps_its_number";
    refused_until_the_bind_goes(test, "node-local-users-del", How::DeletedNodeUsersOwn).await;
}

/// A handle's stage of a disk bound `how` (a way that cannot be told) is refused, and changes
/// nothing, until the bind goes; then it is taken.
async fn refused_until_the_bind_goes(test: &str, label: &str, how: How) {
    let _ns = crate::NAMESPACE_COPY.write().await;
    if !require_root(test) {
        return;
    }
    let scratch = Scratch::new(label);
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let disk = crate::Disk::new(&scratch, "held", 64 << 20);
    let theirs = BoundElsewhere::by(how, &scratch.path, &disk.dev, &scratch.join("ctr"));
    let before = checksum(&disk.dev);
    let mounts = mounts_below(&agent.work);
    let e = disk
        .stage_handle(&agent)
        .await
        .expect_err(&format!("{how:?}: a handle took a device bound elsewhere"));
    assert_eq!(e.code(), Code::FailedPrecondition, "{how:?}: {e:?}");
    assert_eq!(before, checksum(&disk.dev), "the device's bytes changed");
    assert_eq!(mounts, mounts_below(&agent.work), "the host changed");
    drop(theirs);
    disk.stage_handle(&agent)
        .await
        .expect("the stage once the bind is gone");
    disk.unstage_handle(&agent).await.expect("unstage");
}
