//! Freezes for a consistent copy, and thaws at start-up, act only on the volume's own filesystem
//! (a twenty-second fresh review's F1 and F3).

use super::*;

/// A filesystem laid over the volume's staging path (another volume's, bound there by hand) is
/// never frozen for the volume's snapshot: the freeze goes through a mount point whose directory
/// is on the volume's device (its publication), and the other volume's writers never wait.
#[tokio::test]
async fn a_snapshot_freezes_only_the_volumes_own_filesystem() {
    if !require_root("a_snapshot_freezes_only_the_volumes_own_filesystem") {
        return;
    }
    let scratch = Scratch::new("freeze-own");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let a = create_volume(&agent, "fa", 64 * MIB, &[]).await;
    let b = create_volume(&agent, "fb", 64 * MIB, &[]).await;
    let (va, sa, ta) = mount(&agent, &a, "fa").await;
    let (vb, sb, tb) = mount(&agent, &b, "fb").await;
    sh(&format!("mount --bind {} {}", sb.display(), sa.display()));
    let snap = snapshot(&agent, "fa-snap", &a).await;
    assert!(snap.ready_to_use);
    let log = agent.log_text();
    let line = log
        .lines()
        .rfind(|l| l.contains("copied a volume file") && l.contains(&a))
        .expect("the copy's line");
    assert!(line.contains("frozen=true"), "{line}");
    assert!(
        line.contains(&format!("frozen_at={}", ta.display())),
        "the snapshot froze another filesystem: {line}"
    );
    sh(&format!("umount {}", sa.display()));
    unmount(&agent, &vb, &sb, &tb).await;
    unmount(&agent, &va, &sa, &ta).await;
}

/// The volume's filesystem mounted through a second loop device over its file (an operator's,
/// with the controller's own device idle) is frozen for the snapshot: every device that shows
/// the file's bytes is asked (a twenty-ninth fresh review's F1: only the first device over the
/// file was, the idle one, and the volume was copied live while written).
#[tokio::test]
async fn a_snapshot_freezes_the_filesystem_whichever_device_shows_it() {
    if !require_root("a_snapshot_freezes_the_filesystem_whichever_device_shows_it") {
        return;
    }
    let scratch = Scratch::new("freeze-views");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let a = create_volume(&agent, "fv", 64 * MIB, &[]).await;
    let (va, sa, ta) = mount(&agent, &a, "fv").await;
    unmount(&agent, &va, &sa, &ta).await;
    // Attached again and idle: the first device over the file is the controller's.
    let _idle = attach(&agent, &a).await;
    let file = agent.state_dir.join(format!("volumes/{a}.img"));
    let second =
        String::from_utf8_lossy(&sh(&format!("losetup -f --show {}", file.display())).stdout)
            .trim()
            .to_string();
    let at = scratch.join("operators");
    std::fs::create_dir_all(&at).expect("mount point");
    sh(&format!("mount {second} {}", at.display()));
    let snap = snapshot(&agent, "fv-snap", &a).await;
    assert!(snap.ready_to_use);
    let log = agent.log_text();
    let line = log
        .lines()
        .rfind(|l| l.contains("copied a volume file") && l.contains(&a))
        .expect("the copy's line");
    sh(&format!("umount {}", at.display()));
    detach_loop(Path::new(&second));
    assert!(line.contains("frozen=true"), "copied live: {line}");
    assert!(line.contains(&at.display().to_string()), "{line}");
}

/// A freeze the agent did not make (an operator's backup) is not broken by a restart: start-up
/// thaws only a volume a copy was interrupted from.
#[tokio::test]
async fn start_up_thaws_only_what_an_interrupted_copy_froze() {
    if !require_root("start_up_thaws_only_what_an_interrupted_copy_froze") {
        return;
    }
    let scratch = Scratch::new("freeze-theirs");
    let mut agent = Agent::start(&scratch, AgentOpts::default()).await;
    let a = create_volume(&agent, "fo", 64 * MIB, &[]).await;
    let (va, sa, ta) = mount(&agent, &a, "fo").await;
    sh(&format!("fsfreeze -f {}", sa.display()));
    let thaw = Thaw(sa.clone());
    agent.restart(None).await;
    let _ = agent.identity().await;
    // Start-up's loop recovery runs in the background: give it the time it takes.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let out = std::process::Command::new("fsfreeze")
        .arg("-u")
        .arg(&sa)
        .output()
        .expect("fsfreeze");
    std::mem::forget(thaw);
    assert!(
        out.status.success(),
        "the operator's freeze was broken by the restart: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    unmount(&agent, &va, &sa, &ta).await;
}

/// Thaws the test's freeze if the test ends early.
struct Thaw(PathBuf);

impl Drop for Thaw {
    fn drop(&mut self) {
        let _ = std::process::Command::new("fsfreeze")
            .arg("-u")
            .arg(&self.0)
            .output();
    }
}

/// A snapshot refused because the filesystem could not be frozen (an operator's backup freeze)
/// leaves no unready record: a later restart takes no copy for one a crash cut, and leaves the
/// operator's next freeze alone (a thirtieth fresh review's F3).
#[tokio::test]
async fn a_snapshot_that_froze_nothing_leaves_no_record_for_start_up_to_thaw() {
    if !require_root("a_snapshot_that_froze_nothing_leaves_no_record_for_start_up_to_thaw") {
        return;
    }
    let scratch = Scratch::new("freeze-refused");
    let mut agent = Agent::start(&scratch, AgentOpts::default()).await;
    let a = create_volume(&agent, "fr", 64 * MIB, &[]).await;
    let (va, sa, ta) = mount(&agent, &a, "fr").await;
    sh(&format!("fsfreeze -f {}", sa.display()));
    let thaw = Thaw(sa.clone());
    let e = agent
        .controller()
        .await
        .create_snapshot(csi::CreateSnapshotRequest {
            source_volume_id: a.clone(),
            name: "fr-snap".into(),
            ..Default::default()
        })
        .await
        .expect_err("a snapshot of a filesystem frozen by someone else");
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    agent.restart(None).await;
    let _ = agent.identity().await;
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let out = std::process::Command::new("fsfreeze")
        .arg("-u")
        .arg(&sa)
        .output()
        .expect("fsfreeze");
    std::mem::forget(thaw);
    assert!(
        out.status.success(),
        "the operator's freeze was broken by the restart: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    unmount(&agent, &va, &sa, &ta).await;
}
