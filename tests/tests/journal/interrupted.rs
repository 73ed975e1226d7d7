//! Calls cut between a host change and its record, and what was done to the host meanwhile:
//! a stage killed after its mount while the device's node was bound elsewhere (through start-up
//! recovery and `recover --from-mounts`), a finished mkfs whose record was lost and whose
//! filesystem was used since, and `recover` and `status` beside a running agent.

use ebs_tests::crash_points::{self as cp, Op as J, Step as S};

use super::*;

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
    let (scratch, mut agent, c) = cut_after_its_mount("cut-after-mount").await;
    assert_eq!(mount_count(&c.staging), 1, "the cut stage had mounted");
    let uuid = fs_uuid(&c.vol.device);
    let unbind = bind_its_node(&scratch, &c);
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
    let (scratch, mut agent, c) = cut_after_its_mount("rebuilt-cut").await;
    let unbind = bind_its_node(&scratch, &c);
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

/// A stage cut after its mount, and a filesystem laid over its staging path, or over the
/// directory above it, while the agent is down: start-up keeps the record (in progress), the
/// unstage is refused while the stage's own mount lies below the cover, and once the cover goes
/// the retry adopts that mount (a sixty-third fresh review's F2 and a sixty-fourth's F4: the
/// record was dropped as a stage cut before its mount, and the unstage then answered OK over the
/// hidden mount).
#[tokio::test]
async fn a_stage_cut_after_its_mount_and_covered_keeps_its_record() {
    if !require_root("a_stage_cut_after_its_mount_and_covered_keeps_its_record") {
        return;
    }
    for parent in [false, true] {
        let case = if parent { "parent" } else { "path" };
        let (scratch, mut agent, c) = cut_after_its_mount(&format!("cut-covered-{case}")).await;
        let cover_at = match parent {
            true => c.staging.parent().expect("a parent").to_path_buf(),
            false => c.staging.clone(),
        };
        let image = scratch.join("cover.img");
        sh(&format!(
            "truncate -s 32M {0} && mkfs.ext4 -q {0}",
            image.display()
        ));
        // A loop device with autoclear: it goes with the cover's unmount.
        sh(&format!(
            "mount -o loop {} {}",
            image.display(),
            cover_at.display()
        ));
        let cover = Unmount(cover_at.clone());
        agent.restart(Some(crash_opts(None))).await;
        let log = agent.log_text();
        assert!(!log.contains("record dropped"), "{case}: {log}");
        let e = call(&agent, &c, Op::Unstage)
            .await
            .expect_err("unstaged over the hidden mount");
        assert_eq!(e.code(), Code::FailedPrecondition, "{case}: {e:?}");
        drop(cover);
        assert_eq!(
            mount_count(&c.staging),
            1,
            "{case}: the stage's own mount went"
        );
        call(&agent, &c, Op::Stage).await.expect("the retry");
        call(&agent, &c, Op::Publish).await.expect("publish");
        call(&agent, &c, Op::Unpublish).await.expect("unpublish");
        call(&agent, &c, Op::Unstage).await.expect("unstage");
        assert_eq!(mount_count(&c.staging), 0, "{case}");
        assert_eq!(agent.log_text().matches(" formatted").count(), 1, "{case}");
    }
}

/// An agent killed right after a filesystem stage's mount, before it asked what else uses the
/// device (`stage.recheck.intent`), the staging mounted.
async fn cut_after_its_mount(prefix: &str) -> (Scratch, Agent, Cycle) {
    let point = cp::intent(J::Stage, S::Recheck);
    let (scratch, mut agent, c) =
        agent_with_volume(prefix, crash_opts(Some(&point)), "cut", 64 << 20, "ext4").await;
    assert!(call(&agent, &c, Op::Stage).await.is_err());
    agent
        .wait_exit(Duration::from_secs(20))
        .await
        .expect("crashed");
    (scratch, agent, c)
}

/// A bind of the volume's device node onto a file of the scratch directory (any user can make
/// one in a namespace of its own), unmounted on drop.
fn bind_its_node(scratch: &Scratch, c: &Cycle) -> Unmount {
    let bound = scratch.join("users-bind");
    std::fs::write(&bound, b"").expect("the bind's file");
    sh(&format!(
        "mount --bind {} {}",
        c.vol.device,
        bound.display()
    ));
    Unmount(bound)
}

/// An xfs whose mkfs never finished (its superblock still says so, with the intent's UUID) is
/// redone only while nothing lies past mkfs's first writes: raw writes made behind it while the
/// agent was down are refused, not formatted over (a sixty-second fresh review's F2: 8 of 64
/// markers overwritten); with its superblock alone, the redo goes through.
#[tokio::test]
async fn an_unfinished_xfs_is_redone_only_over_its_own_first_writes() {
    if !require_root("an_unfinished_xfs_is_redone_only_over_its_own_first_writes") {
        return;
    }
    for written in [true, false] {
        let point = cp::intent(J::Stage, S::Format);
        let prefix = format!("xfs-unfinished-{written}");
        let (scratch, mut agent, c) =
            agent_with_volume(&prefix, crash_opts(Some(&point)), "x", 320 << 20, "xfs").await;
        assert!(call(&agent, &c, Op::Stage).await.is_err());
        agent
            .wait_exit(Duration::from_secs(20))
            .await
            .expect("crashed");
        let v = agent.status_json();
        let uuid = v["volumes"][0]["filesystem"]["uuid"]
            .as_str()
            .expect("the intent's UUID")
            .to_string();
        // What mkfs.xfs writes first: its superblock, marked in progress, with the UUID. Made
        // on a copy, and only its first sector laid on the device.
        let head = scratch.join("head.img");
        sh(&format!("truncate -s 320M {}", head.display()));
        sh(&format!(
            "mkfs.xfs -q -f -K -m uuid={uuid} {}",
            head.display()
        ));
        sh(&format!(
            "xfs_db -x -c 'sb 0' -c 'write inprogress 1' {} >/dev/null",
            head.display()
        ));
        sh(&format!(
            "dd if={} of={} bs=512 count=1 conv=notrunc,fsync status=none",
            head.display(),
            c.vol.device
        ));
        if written {
            sh(&format!(
                "printf 'USERDATA-must-survive' | dd of={} bs=1 seek=$((64 << 20)) conv=notrunc,fsync status=none",
                c.vol.device
            ));
        }
        agent.restart(Some(crash_opts(None))).await;
        let r = call(&agent, &c, Op::Stage).await;
        if written {
            let e = r.expect_err("formatted over data written behind the superblock");
            assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
            assert!(
                !agent.log_text().contains(" formatted"),
                "{}",
                agent.log_text()
            );
            let out = sh(&format!(
                "dd if={} bs=1 skip=$((64 << 20)) count=21 status=none",
                c.vol.device
            ));
            assert_eq!(&out.stdout[..], b"USERDATA-must-survive", "the data");
        } else {
            r.unwrap_or_else(|e| panic!("the redo of our own first writes: {e:?}"));
            assert_eq!(agent.log_text().matches(" formatted").count(), 1);
            assert_eq!(fs_uuid(&c.vol.device), uuid);
            call(&agent, &c, Op::Unstage).await.expect("unstage");
        }
    }
}
