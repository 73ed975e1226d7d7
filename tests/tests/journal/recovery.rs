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

/// A complete stage whose mount a filesystem laid over its staging path, or over the directory
/// above it, hides while the agent is down: start-up keeps the record (the device is still
/// mounted), the unstage is refused while the hidden mount lives, and once the cover goes the
/// cycle goes on (a sixty-fifth fresh review's F3: the record was dropped as "gone (reboot?)", and
/// the unstage answered OK over the live mount).
#[tokio::test]
async fn a_complete_stage_hidden_by_a_cover_keeps_its_record() {
    if !require_root("a_complete_stage_hidden_by_a_cover_keeps_its_record") {
        return;
    }
    for parent in [false, true] {
        let case = if parent { "parent" } else { "path" };
        let (scratch, mut agent, c) = agent_with_volume(
            &format!("hidden-{case}"),
            AgentOpts::default(),
            "hidden",
            64 << 20,
            "ext4",
        )
        .await;
        call(&agent, &c, Op::Stage).await.expect("stage");
        // The stage's completion is lazy: the publish's durable intent carries it.
        call(&agent, &c, Op::Publish).await.expect("publish");
        call(&agent, &c, Op::Unpublish).await.expect("unpublish");
        agent.kill();
        let cover_at = match parent {
            true => c.staging.parent().expect("a parent").to_path_buf(),
            false => c.staging.clone(),
        };
        sh(&format!("mount -t tmpfs cover {}", cover_at.display()));
        let cover = Unmount(cover_at);
        agent.spawn().await;
        let log = agent.log_text();
        assert!(!log.contains("staging mount is gone"), "{case}: {log}");
        assert!(log.contains("record kept"), "{case}: {log}");
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
        call(&agent, &c, Op::Publish).await.expect("publish");
        call(&agent, &c, Op::Unpublish).await.expect("unpublish");
        call(&agent, &c, Op::Unstage).await.expect("unstage");
        assert_eq!(mount_count(&c.staging), 0, "{case}");
        drop((c, agent, scratch));
    }
}
