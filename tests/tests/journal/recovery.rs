//! Recovery beyond a killed call: a reboot behind the agent's back, a swapped device, a corrupt
//! state file, `status` with the agent stopped, and an interrupted mkfs.

use ebs_tests::crash_points::{self as cp, Op as J, Step as S};

use super::*;

#[tokio::test]
async fn reboot_behind_the_agents_back() {
    if !require_root("reboot_behind_the_agents_back") {
        return;
    }
    let (_scratch, mut agent, c) =
        agent_with_volume("reboot", AgentOpts::default(), "reboot", 64 << 20, "ext4").await;
    let vol = c.vol.clone();
    call(&agent, &c, Op::Stage).await.unwrap();
    call(&agent, &c, Op::Publish).await.unwrap();
    std::fs::write(c.target.join("f"), b"kept").unwrap();
    agent.kill();
    // A reboot: every mount and the loop device are gone.
    sh(&format!(
        "umount {} && umount {}",
        c.target.display(),
        c.staging.display()
    ));
    sh(&format!("losetup -d {}", vol.device));
    agent.spawn().await;
    let log = agent.log_text();
    assert!(log.contains("staging mount is gone"), "{log}");
    // Unpublish and unstage of what is already gone answer OK.
    call(&agent, &c, Op::Unpublish).await.unwrap();
    call(&agent, &c, Op::Unstage).await.unwrap();
    // A new cycle works: the controller re-attached the file at start; ask it for the device.
    let vol = attach(&agent, &vol.id).await;
    let c = Cycle { vol, ..c };
    call(&agent, &c, Op::Stage).await.unwrap();
    call(&agent, &c, Op::Publish).await.unwrap();
    assert_eq!(std::fs::read(c.target.join("f")).unwrap(), b"kept");
    call(&agent, &c, Op::Unpublish).await.unwrap();
    call(&agent, &c, Op::Unstage).await.unwrap();
    assert_eq!(agent.log_text().matches(" formatted").count(), 1);
}

#[tokio::test]
async fn swapped_device_is_refused_and_nothing_is_formatted() {
    if !require_root("swapped_device_is_refused_and_nothing_is_formatted") {
        return;
    }
    let (_scratch, agent, c) =
        agent_with_volume("swap-dev", AgentOpts::default(), "swap", 64 << 20, "ext4").await;
    let vol = c.vol.clone();
    call(&agent, &c, Op::Stage).await.unwrap();
    call(&agent, &c, Op::Unstage).await.unwrap();
    // Swap the volume's backing file for a blank one under the same path.
    let node = node_id(&agent).await;
    agent
        .controller()
        .await
        .controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
            volume_id: vol.id.clone(),
            node_id: node,
            ..Default::default()
        })
        .await
        .unwrap();
    let file = agent.state_dir.join(format!("volumes/{}.img", vol.id));
    std::fs::remove_file(&file).unwrap();
    let f = std::fs::File::create(&file).unwrap();
    f.set_len(64 << 20).unwrap();
    drop(f);
    let vol = attach(&agent, &vol.id).await;
    let c = Cycle {
        vol: vol.clone(),
        ..c
    };
    let e = call(&agent, &c, Op::Stage).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(
        e.message().contains("wrong device") || e.message().contains("changed"),
        "{}",
        e.message()
    );
    assert_eq!(fs_uuid(&vol.device), "", "nothing formatted");
    assert_eq!(mount_count(&c.staging), 0);
}

#[tokio::test]
async fn corrupt_state_file_is_refused_and_recover_rebuilds_it() {
    if !require_root("corrupt_state_file_is_refused_and_recover_rebuilds_it") {
        return;
    }
    let (_scratch, mut agent, c) =
        agent_with_volume("corrupt", AgentOpts::default(), "corrupt", 64 << 20, "ext4").await;
    let vol = c.vol.clone();
    call(&agent, &c, Op::Stage).await.unwrap();
    call(&agent, &c, Op::Publish).await.unwrap();
    agent.kill();
    let state = agent.state_dir.join("state.redb");
    std::fs::write(&state, vec![0x42u8; 64 * 1024]).unwrap();

    let out = std::process::Command::new(agent_bin())
        .args(agent.serve_args())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("corrupt") && err.contains("recover --from-mounts"),
        "{err}"
    );

    let out = std::process::Command::new(agent_bin())
        .args(["recover", "--from-mounts", "--state-dir"])
        .arg(&agent.state_dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("1 staged volume(s) and 1 publication(s)"),
        "{said}"
    );

    agent.spawn().await;
    let (ok, status) = agent.client_json(&["node", "info"]);
    assert!(ok, "{status}");
    let v = agent.status_json();
    assert_eq!(v["volumes"][0]["volume_id"], vol.id.as_str(), "{v}");
    // The CO's next calls work on the rebuilt state, without formatting anything.
    call(&agent, &c, Op::Publish).await.unwrap();
    call(&agent, &c, Op::Unpublish).await.unwrap();
    call(&agent, &c, Op::Unstage).await.unwrap();
    call(&agent, &c, Op::Stage).await.unwrap();
    call(&agent, &c, Op::Unstage).await.unwrap();
    let formats = agent.log_text().matches(" formatted").count();
    assert_eq!(
        formats, 1,
        "recovery must not format (the one format is the first stage's)"
    );
}

#[tokio::test]
async fn status_reads_the_stopped_agents_file() {
    if !require_root("status_reads_the_stopped_agents_file") {
        return;
    }
    let (_scratch, mut agent, c) =
        agent_with_volume("status", AgentOpts::default(), "st", 64 << 20, "ext4").await;
    call(&agent, &c, Op::Stage).await.unwrap();
    let running = std::process::Command::new(agent_bin())
        .args(["status", "--endpoint", &agent.endpoint(), "--state-dir"])
        .arg(&agent.state_dir)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&running.stdout).into_owned();
    assert!(
        text.starts_with("from the running agent on unix://"),
        "{text}"
    );
    assert!(text.contains("\n  staged at     "), "{text}");
    agent.terminate().await.unwrap();
    let v = agent.status_json();
    assert_eq!(v["volumes"][0]["last_step"]["step"], "staged");
    // The same from the stopped agent's file, as text for people: words, aligned labels, an
    // ISO-8601 time with how long ago, and no Rust Debug quoting.
    let stopped = std::process::Command::new(agent_bin())
        .args(["status", "--endpoint", &agent.endpoint(), "--state-dir"])
        .arg(&agent.state_dir)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&stopped.stdout).into_owned();
    assert!(text.starts_with("from the state file "), "{text}");
    assert!(
        text.contains("\n  state         staged, not published\n"),
        "{text}"
    );
    assert!(text.contains("\n  filesystem    ext4, UUID "), "{text}");
    let last = text
        .lines()
        .find(|l| l.starts_with("  last step     stage step staged: done, "))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        last.contains("Z (just now)") || last.contains(" s ago)"),
        "{last}"
    );
    assert!(!text.contains('"'), "{text}");
    // Clean up the mount the stopped agent left (the Scratch guard would too).
    sh(&format!("umount {}", c.staging.display()));
}

/// mkfs killed half-way: the device shows our own filesystem (the UUID the journal chose): the
/// retry formats again with that UUID. A device showing anything else is refused, also bytes
/// without a superblock: mkfs's own metadata cannot be told from data someone wrote since, and a
/// format intent never licenses formatting over data (the operator wipes the device instead).
#[tokio::test]
async fn interrupted_mkfs_is_redone_only_over_its_own_work() {
    if !require_root("interrupted_mkfs_is_redone_only_over_its_own_work") {
        return;
    }
    for leftover in ["own-superblock", "metadata-only", "foreign"] {
        let (_scratch, mut agent, c) = agent_with_volume(
            &format!("mkfs-{leftover}"),
            crash_opts(Some(&cp::intent(J::Stage, S::Format))),
            "m",
            64 << 20,
            "ext4",
        )
        .await;
        let vol = c.vol.clone();
        assert!(call(&agent, &c, Op::Stage).await.is_err());
        agent
            .wait_exit(Duration::from_secs(20))
            .await
            .expect("crashed");
        let v = agent.status_json();
        let intended = v["volumes"][0]["filesystem"]["uuid"]
            .as_str()
            .unwrap()
            .to_string();
        assert_eq!(v["volumes"][0]["filesystem"]["state"], "intent");
        match leftover {
            "own-superblock" => sh(&format!("mkfs.ext4 -q -F -U {intended} {}", vol.device)),
            "metadata-only" => sh(&format!(
                "head -c 262144 /dev/urandom | dd of={} bs=64k seek=2 conv=notrunc status=none",
                vol.device
            )),
            _ => sh(&format!("mkfs.ext4 -q -F {}", vol.device)),
        };
        let foreign_uuid = fs_uuid(&vol.device);
        let before = checksum(std::path::Path::new(&vol.device));
        agent.restart(Some(crash_opts(None))).await;
        let r = call(&agent, &c, Op::Stage).await;
        if leftover != "own-superblock" {
            let e = r.unwrap_err();
            assert_eq!(e.code(), Code::FailedPrecondition, "{leftover}: {e:?}");
            assert_eq!(
                fs_uuid(&vol.device),
                foreign_uuid,
                "{leftover}: whatever is there is untouched"
            );
            assert_eq!(
                checksum(std::path::Path::new(&vol.device)),
                before,
                "{leftover}: not a byte changed"
            );
        } else {
            r.unwrap_or_else(|e| panic!("{leftover}: {e:?}"));
            assert_eq!(fs_uuid(&vol.device), intended, "{leftover}");
            call(&agent, &c, Op::Unstage).await.unwrap();
        }
    }
}

/// A filesystem stage killed after its mount and before it asks what else uses the device, and
/// a bind of the device's node made while the agent is down (any user can make one in a
/// namespace of its own). Start-up asks before it completes the stage: it takes the mount down
/// and forgets the stage; a publish is refused and binds nothing, the stage's retry is refused
/// and mounts nothing, and once the bind goes the stage goes through on the filesystem the cut
/// stage made (a fifty-sixth fresh review's F1: start-up completed the record, and the publish
/// handed the device out).
#[tokio::test]
async fn a_stage_cut_after_its_mount_is_not_completed_over_a_bind_of_its_device() {
    if !require_root("a_stage_cut_after_its_mount_is_not_completed_over_a_bind_of_its_device") {
        return;
    }
    let point = cp::intent(J::Stage, S::Recheck);
    let (scratch, mut agent, c) = agent_with_volume(
        "cut-after-mount",
        crash_opts(Some(&point)),
        "cut",
        64 << 20,
        "ext4",
    )
    .await;
    assert!(call(&agent, &c, Op::Stage).await.is_err());
    agent
        .wait_exit(Duration::from_secs(20))
        .await
        .expect("crashed");
    assert_eq!(mount_count(&c.staging), 1, "the cut stage had mounted");
    let uuid = fs_uuid(&c.vol.device);
    let bound = scratch.join("users-bind");
    std::fs::write(&bound, b"").expect("the bind's file");
    sh(&format!(
        "mount --bind {} {}",
        c.vol.device,
        bound.display()
    ));
    let unbind = Unmount(bound.clone());
    agent.restart(Some(crash_opts(None))).await;
    let log = agent.log_text();
    assert_eq!(
        mount_count(&c.staging),
        0,
        "start-up left the mount:\n{log}"
    );
    assert!(log.contains("in use elsewhere; unstaged"), "{log}");
    let e = call(&agent, &c, Op::Publish).await.expect_err("published");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert_eq!(mount_count(&c.target), 0, "the publish bound something");
    let e = call(&agent, &c, Op::Stage).await.expect_err("staged");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("raw use"), "{e:?}");
    assert_eq!(mount_count(&c.staging), 0, "the refused retry mounted");
    drop(unbind);
    call(&agent, &c, Op::Stage)
        .await
        .expect("the stage, the bind gone");
    assert_eq!(fs_uuid(&c.vol.device), uuid, "formatted again");
    call(&agent, &c, Op::Publish).await.expect("publish");
    call(&agent, &c, Op::Unpublish).await.expect("unpublish");
    call(&agent, &c, Op::Unstage).await.expect("unstage");
    assert_eq!(agent.log_text().matches(" formatted").count(), 1);
}

/// The same cut stage and bind, through `recover --from-mounts` (a fifty-seventh fresh review's
/// F1: the rebuilt staging was complete, start-up asked nothing, and the publish handed the
/// device out). A rebuilt filesystem staging is in progress until start-up asks its questions;
/// and the bind itself is none of the volume's publications (its F3: it was rebuilt as a block
/// publication that held the volume for good).
#[tokio::test]
async fn recover_from_mounts_asks_before_a_rebuilt_stage_is_handed_out() {
    if !require_root("recover_from_mounts_asks_before_a_rebuilt_stage_is_handed_out") {
        return;
    }
    let point = cp::intent(J::Stage, S::Recheck);
    let (scratch, mut agent, c) = agent_with_volume(
        "rebuilt-cut",
        crash_opts(Some(&point)),
        "cut",
        64 << 20,
        "ext4",
    )
    .await;
    assert!(call(&agent, &c, Op::Stage).await.is_err());
    agent
        .wait_exit(Duration::from_secs(20))
        .await
        .expect("crashed");
    let bound = scratch.join("users-bind");
    std::fs::write(&bound, b"").expect("the bind's file");
    sh(&format!(
        "mount --bind {} {}",
        c.vol.device,
        bound.display()
    ));
    let unbind = Unmount(bound.clone());
    let out = std::process::Command::new(agent_bin())
        .args(["recover", "--from-mounts", "--state-dir"])
        .arg(&agent.state_dir)
        .output()
        .expect("recover");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    agent.restart(Some(crash_opts(None))).await;
    let log = agent.log_text();
    assert_eq!(
        mount_count(&c.staging),
        0,
        "start-up left the mount:\n{log}"
    );
    let e = call(&agent, &c, Op::Publish).await.expect_err("published");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert_eq!(mount_count(&c.target), 0, "the publish bound something");
    assert!(said.contains("none of its publications"), "{said}");
    drop(unbind);
    call(&agent, &c, Op::Stage)
        .await
        .expect("the stage, the bind gone");
    call(&agent, &c, Op::Publish).await.expect("publish");
    call(&agent, &c, Op::Unpublish).await.expect("unpublish");
    call(&agent, &c, Op::Unstage).await.expect("unstage");
    assert_eq!(agent.log_text().matches(" formatted").count(), 1);
}

/// `recover` moves the state file aside only once no agent holds it is proven, and `status`
/// reading the file says a running agent holds it, whatever the temporary directory is (a
/// fifty-seventh fresh review's F2: the read-only check's copy had a predictable name in /tmp;
/// any user who took it first, or a TMPDIR that did not exist, turned "in use" into "corrupt",
/// and `recover --reset` moved a live agent's file aside).
#[tokio::test]
async fn recover_and_status_never_take_a_running_agents_file_for_a_broken_one() {
    if !require_root("recover_and_status_never_take_a_running_agents_file_for_a_broken_one") {
        return;
    }
    let (_scratch, agent, c) =
        agent_with_volume("held", AgentOpts::default(), "held", 64 << 20, "ext4").await;
    call(&agent, &c, Op::Stage).await.unwrap();
    let state = agent.state_dir.join("state.redb");
    use std::os::unix::fs::MetadataExt;
    let before = std::fs::metadata(&state).expect("state file").ino();
    for tmp in ["/nonexistent", "/proc"] {
        let out = std::process::Command::new(agent_bin())
            .args(["recover", "--reset", "--state-dir"])
            .arg(&agent.state_dir)
            .env("TMPDIR", tmp)
            .output()
            .expect("recover");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "TMPDIR={tmp}: {err}");
        assert!(
            err.contains("in use: stop the agent first"),
            "TMPDIR={tmp}: {err}"
        );
        let out = std::process::Command::new(agent_bin())
            .args([
                "status",
                "--endpoint",
                "unix:///nonexistent/csi.sock",
                "--state-dir",
            ])
            .arg(&agent.state_dir)
            .env("TMPDIR", tmp)
            .output()
            .expect("status");
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(said.contains("in use"), "TMPDIR={tmp}: {said}");
        assert!(!said.contains("corrupt"), "TMPDIR={tmp}: {said}");
    }
    assert_eq!(std::fs::metadata(&state).expect("state file").ino(), before);
    call(&agent, &c, Op::Unstage)
        .await
        .expect("the agent carries on");
}

/// mkfs finished and the agent was killed before its record said so; meanwhile the filesystem
/// was mounted and written (root, while the agent was down). The retried stage uses it as
/// found, checked, and never formats it again: a redo is only for an xfs whose mkfs never
/// finished (a fifty-ninth fresh review's F2: the retry formatted it, and the file was gone).
#[tokio::test]
async fn a_finished_mkfs_whose_record_was_lost_is_never_formatted_again() {
    if !require_root("a_finished_mkfs_whose_record_was_lost_is_never_formatted_again") {
        return;
    }
    for fs in ["ext4", "xfs"] {
        let size = if fs == "xfs" { 320 << 20 } else { 64 << 20 };
        // Killed right after the intent; mkfs then runs as the agent's would have (with the
        // intent's UUID), which is the state a kill between mkfs's end and its record leaves.
        let point = cp::intent(J::Stage, S::Format);
        let (scratch, mut agent, c) = agent_with_volume(
            &format!("mkfs-used-{fs}"),
            crash_opts(Some(&point)),
            "u",
            size,
            fs,
        )
        .await;
        assert!(call(&agent, &c, Op::Stage).await.is_err(), "{fs}");
        agent
            .wait_exit(Duration::from_secs(20))
            .await
            .expect("crashed");
        let v = agent.status_json();
        assert_eq!(
            v["volumes"][0]["filesystem"]["state"], "intent",
            "{fs}: {v}"
        );
        let uuid = v["volumes"][0]["filesystem"]["uuid"]
            .as_str()
            .expect("the intent's UUID")
            .to_string();
        match fs {
            "xfs" => sh(&format!("mkfs.xfs -q -f -m uuid={uuid} {}", c.vol.device)),
            _ => sh(&format!("mkfs.ext4 -q -F -U {uuid} {}", c.vol.device)),
        };
        let mnt = scratch.join("operators-mount");
        std::fs::create_dir_all(&mnt).expect("mount point");
        sh(&format!("mount -t {fs} {} {}", c.vol.device, mnt.display()));
        let unmount = Unmount(mnt.clone());
        std::fs::write(mnt.join("precious"), b"written while the agent was down").unwrap();
        drop(unmount);
        agent.restart(Some(crash_opts(None))).await;
        call(&agent, &c, Op::Stage)
            .await
            .unwrap_or_else(|e| panic!("{fs}: {e:?}\n{}", agent.log_text()));
        assert_eq!(
            std::fs::read(c.staging.join("precious")).ok().as_deref(),
            Some(&b"written while the agent was down"[..]),
            "{fs}: formatted again:\n{}",
            agent.log_text()
        );
        assert_eq!(agent.log_text().matches(" formatted").count(), 0, "{fs}");
        call(&agent, &c, Op::Unstage).await.expect("unstage");
    }
}
