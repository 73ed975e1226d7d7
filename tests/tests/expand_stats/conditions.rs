//! Volume conditions produced for real, and stats that do not wait for the volume guard.

use ebs_tests::csi_req::*;
use ebs_tests::*;

use csi::volume_capability::access_mode::Mode;

use super::*;

#[tokio::test]
async fn conditions_are_reported_for_real_breakage() {
    if !require_root("conditions_are_reported_for_real_breakage") {
        return;
    }
    let scratch = Scratch::new("conditions");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let ext4 = || mount_cap("ext4", Mode::SingleNodeWriter);

    // Healthy.
    let healthy = placed(&agent, "healthy", 32 * MIB, ext4()).await;
    let s = stats(&agent, &healthy.vol.id, &healthy.target)
        .await
        .unwrap();
    assert_eq!(condition(&s), (false, "volume is healthy".to_string()));
    assert!(
        !condition(
            &stats(&agent, &healthy.vol.id, &healthy.staging)
                .await
                .unwrap()
        )
        .0
    );

    // The publication's mount is lazily unmounted behind the agent's back.
    let lazy = placed(&agent, "lazy", 32 * MIB, ext4()).await;
    sh(&format!("umount -l {}", lazy.target.display()));
    let s = stats(&agent, &lazy.vol.id, &lazy.target).await.unwrap();
    let (abnormal, msg) = condition(&s);
    assert!(abnormal && msg.contains("no longer mounted at"), "{msg}");
    assert!(s.usage.is_empty(), "nothing to measure: {:?}", s.usage);
    eprintln!("mount gone: {msg}");

    // The kernel remounts the filesystem read-only after an error (errors=remount-ro)...
    let ro = placed(
        &agent,
        "ro",
        32 * MIB,
        mount_cap_flags("ext4", Mode::SingleNodeWriter, &["errors=remount-ro"]),
    )
    .await;
    let dev_name = ro.vol.device.trim_start_matches("/dev/");
    std::fs::write(
        format!("/sys/fs/ext4/{dev_name}/trigger_fs_error"),
        "test: simulated error\n",
    )
    .unwrap();
    let (abnormal, msg) = abnormal_condition(&agent, &ro.vol.id, &ro.target).await;
    assert!(
        abnormal && msg.contains("read-only although it was mounted read-write"),
        "{msg}"
    );
    assert!(
        std::fs::write(ro.target.join("f"), b"x").is_err(),
        "writes really fail"
    );
    eprintln!("read-only after errors: {msg}");
    // ... or someone remounts it read-only by hand.
    let remounted = placed(&agent, "remounted", 32 * MIB, ext4()).await;
    sh(&format!(
        "mount -o remount,ro {}",
        remounted.staging.display()
    ));
    let (abnormal, msg) = condition(
        &stats(&agent, &remounted.vol.id, &remounted.target)
            .await
            .unwrap(),
    );
    assert!(
        abnormal && msg.contains("read-only although it was mounted read-write"),
        "{msg}"
    );

    // The storage behind the device fails: reads return EIO (the backing file lost its blocks).
    let eio = placed(&agent, "eio", 32 * MIB, ext4()).await;
    std::fs::OpenOptions::new()
        .write(true)
        .open(volume_file(&agent, &eio))
        .unwrap()
        .set_len(0)
        .unwrap();
    let (abnormal, msg) = condition(&stats(&agent, &eio.vol.id, &eio.target).await.unwrap());
    assert!(abnormal && msg.contains("I/O error"), "{msg}");
    eprintln!("I/O error: {msg}");

    // The device disappears: mounts lazily dropped, loop device detached.
    let gone = placed(&agent, "gone", 32 * MIB, ext4()).await;
    sh(&format!(
        "umount -l {} && umount -l {}",
        gone.target.display(),
        gone.staging.display()
    ));
    sh(&format!("losetup -d {}", gone.vol.device));
    wait_detached(&gone.vol.device);
    let (abnormal, msg) = condition(&stats(&agent, &gone.vol.id, &gone.target).await.unwrap());
    // Another test on this host may grab the freed loop device at once: then it carries another
    // file, which is reported as such.
    assert!(
        abnormal && (msg.contains("has disappeared") || msg.contains("no longer carries")),
        "{msg}"
    );
    assert!(msg.contains("no longer mounted"), "{msg}");
    eprintln!("device gone: {msg}");

    // Same device node, same mount point, another backing file: a copy of the volume.
    let swap = placed(&agent, "swap", 32 * MIB, ext4()).await;
    sh(&format!(
        "umount -l {} && umount -l {}",
        swap.target.display(),
        swap.staging.display()
    ));
    // The copy is made first, so that the device number is free for a few milliseconds only:
    // tests running alongside attach loop devices too, and get the lowest free number.
    let copy = scratch.join("swap-copy.img");
    sh(&format!(
        "cp --sparse=always {} {}",
        volume_file(&agent, &swap).display(),
        copy.display()
    ));
    let name = swap.vol.device.trim_start_matches("/dev/");
    sh(&format!(
        "losetup -d {dev} && i=0 && while [ -e /sys/block/{name}/loop/backing_file ] && \
         [ $i -lt 2000 ]; do sleep 0.005; i=$((i+1)); done && losetup {dev} {copy}",
        dev = swap.vol.device,
        copy = copy.display()
    ));
    sh(&format!(
        "mount {} {}",
        swap.vol.device,
        swap.staging.display()
    ));
    let (abnormal, msg) = condition(&stats(&agent, &swap.vol.id, &swap.staging).await.unwrap());
    assert!(
        abnormal && msg.contains("no longer carries volume"),
        "{msg}"
    );
    assert!(
        !msg.contains("no longer mounted"),
        "the mount itself is there: {msg}"
    );
    eprintln!("identity swapped: {msg}");

    // The healthy volume stayed healthy through all of this.
    assert!(
        !condition(
            &stats(&agent, &healthy.vol.id, &healthy.target)
                .await
                .unwrap()
        )
        .0
    );
}

#[tokio::test]
async fn stats_do_not_wait_for_the_volume_guard() {
    if !require_root("stats_do_not_wait_for_the_volume_guard") {
        return;
    }
    let scratch = Scratch::new("stats-concurrent");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let p = placed(
        &agent,
        "busy",
        320 * MIB,
        mount_cap("xfs", Mode::SingleNodeWriter),
    )
    .await;
    controller_expand(&agent, &p, 2048 * MIB).await;
    // Stats calls run while the expansion (which holds the guard) is in flight; none is ABORTED.
    let mut node = agent.node().await;
    let expand = tokio::spawn({
        let req = node_expand_req(&p, &p.target, 2048 * MIB, 0);
        let mut n = agent.node().await;
        async move { n.node_expand_volume(req).await }
    });
    let mut calls = 0;
    while !expand.is_finished() || calls == 0 {
        let r = node
            .node_get_volume_stats(stats_req(&p.vol.id, &p.target))
            .await;
        assert!(r.is_ok(), "{r:?}");
        calls += 1;
    }
    expand.await.unwrap().expect("expand");
    eprintln!("{calls} stats calls answered during one expansion");
}
