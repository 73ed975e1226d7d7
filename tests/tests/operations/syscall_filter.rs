//! A seccomp filter that denies the newer syscalls changes nothing the agent does. systemd 252
//! answers statmount and listmount with the unit's `SystemCallErrorNumber=EPERM` (it does not know
//! them), and `RestrictSUIDSGID=` answers openat2 with ENOSYS (systemd before 248: EPERM). The
//! agent is started through a filter like that (Debian's python3-seccomp, installed by
//! tests/deps.sh) and must serve the whole lifecycle and its start-up recovery as without it,
//! saying once per process which fallback it takes.

use std::ffi::OsString;
use std::path::Path;
use std::process::Command;

use ebs_tests::csi_req::*;
use ebs_tests::seccomp::*;
use ebs_tests::*;

use csi::volume_capability::access_mode::Mode;

#[tokio::test]
async fn denied_statmount_and_openat2_enosys_change_nothing() {
    lifecycle_under_filter("filter-enosys", ENOSYS).await;
}

#[tokio::test]
async fn denied_statmount_and_openat2_eperm_change_nothing() {
    lifecycle_under_filter("filter-eperm", EPERM).await;
}

/// A kernel before 5.12 (mount_setattr ENOSYS) or a filter that denies the new mount API: binds
/// take the bind + remount path, said once per process, and the lifecycle is as without it.
#[tokio::test]
async fn denied_mount_api_takes_the_remount_path() {
    if !require_root("denied_mount_api_takes_the_remount_path") {
        return;
    }
    let old_kernel = filtered(&[(MOUNT_SETATTR, ENOSYS)]);
    let fallbacks = [
        ("mount_setattr", Some(1)),
        ("open_tree", Some(0)),
        ("move_mount", Some(0)),
    ];
    lifecycle("filter-setattr", old_kernel, "ext4", 64 << 20, &fallbacks).await;
    let denied = filtered(&[
        (OPEN_TREE, EPERM),
        (MOVE_MOUNT, EPERM),
        (MOUNT_SETATTR, EPERM),
    ]);
    // The first no stops the probing: one line, not three.
    let fallbacks = [
        ("open_tree", Some(1)),
        ("move_mount", Some(0)),
        ("mount_setattr", Some(0)),
    ];
    lifecycle("filter-mount-api", denied, "ext4", 64 << 20, &fallbacks).await;
}

async fn grow(
    agent: &Agent,
    vol: &Vol,
    staging: &Path,
    target: &Path,
    cap: &csi::VolumeCapability,
    to: i64,
) {
    agent.expand_on_controller(&vol.id, to, None).await.unwrap();
    let req = csi::NodeExpandVolumeRequest {
        volume_id: vol.id.clone(),
        volume_path: target.display().to_string(),
        staging_target_path: staging.display().to_string(),
        capacity_range: at_least(to),
        volume_capability: Some(cap.clone()),
        ..Default::default()
    };
    let total = |p: &Path| {
        let st = nix::sys::statvfs::statvfs(p).unwrap();
        st.blocks() as i64 * st.fragment_size() as i64
    };
    let before = total(target);
    match agent.node().await.node_expand_volume(req).await {
        Ok(r) => assert_eq!(r.into_inner().capacity_bytes, to),
        Err(e) => fail("expand", e, agent.log_text()),
    }
    let after = total(target);
    assert!(
        after > before,
        "{before} bytes before growing, {after} after"
    );
}

fn fail(what: &str, e: tonic::Status, log: String) -> ! {
    panic!("{what} under the filter: {e:?}\nlog:\n{log}")
}

/// The lines of one agent process's log that say a fallback is taken for `syscall`.
fn fallback_lines(log: &str, syscall: &str) -> usize {
    log.lines()
        .filter(|l| l.contains("taking the fallback") && l.contains(&format!("\"{syscall}\"")))
        .count()
}

async fn lifecycle_under_filter(name: &str, openat2_errno: u32) {
    if !require_root(name) {
        return;
    }
    let wrapper = filtered(&unit_like(openat2_errno));
    let fallbacks = [("statmount", Some(1)), ("openat2", Some(1))];
    lifecycle(name, wrapper, "xfs", 320 << 20, &fallbacks).await;
}

/// Stage, publish, write, stats, expand, a crash and restart with the volume staged and
/// published (start-up recovery), stats, read back, unpublish, unstage: all as without a filter.
/// `fallbacks`: how many lines each process must log for a syscall (`None`: at most one).
async fn lifecycle(
    name: &str,
    wrapper: Vec<OsString>,
    fs: &str,
    bytes: i64,
    fallbacks: &[(&str, Option<usize>)],
) {
    let scratch = Scratch::new(name);
    let mut agent = Agent::unstarted(&scratch, AgentOpts::default());
    agent.wrapper = wrapper;
    agent.spawn().await;
    let status = std::fs::read_to_string(format!("/proc/{}/status", agent.pid())).unwrap();
    assert!(
        status.lines().any(|l| l == "Seccomp:\t2"),
        "the agent runs without the filter:\n{status}"
    );

    let vol = create_attached(&agent, "sb", bytes).await;
    // Nested as kubelet's are: resolving them takes openat2 (or the walk), not just the prefix.
    let staging = agent.work.join("plugins/stage/sb");
    let target = agent.work.join("pods/sb/volumes/mount");
    let cap = mount_cap(fs, Mode::SingleNodeWriter);
    let mut node = agent.node().await;
    if let Err(e) = node
        .node_stage_volume(stage_req(&vol, &staging, cap.clone()))
        .await
    {
        fail("stage", e, agent.log_text());
    }
    if let Err(e) = node
        .node_publish_volume(publish_req(&vol, &staging, &target, cap.clone(), false))
        .await
    {
        fail("publish", e, agent.log_text());
    }
    std::fs::write(target.join("data"), b"kept across the restart").unwrap();
    if let Err(e) = node
        .node_get_volume_stats(stats_req(&vol.id, &target))
        .await
    {
        fail("stats", e, agent.log_text());
    }
    // Online ext4 growth needs CAP_SYS_RESOURCE, which a CI host's bounding set may lack; xfs
    // grows with CAP_SYS_ADMIN alone.
    const CAP_SYS_RESOURCE: u32 = 24;
    let can_grow = fs != "ext4" || super::unit_caps::has_effective_cap(CAP_SYS_RESOURCE);
    let to: i64 = bytes + (32 << 20);
    if can_grow {
        grow(&agent, &vol, &staging, &target, &cap, to).await;
    }
    let first = agent.log_text();

    // A crash with the volume staged and published: start-up recovery runs under the filter.
    agent.restart(None).await;
    let second = agent.log_text()[first.len()..].to_string();
    // The publication's completion rides along with a later commit, so a crash right after
    // publish may leave it to recovery to complete: either way recovery found the bind.
    assert!(
        second.contains("recovery: staged and mounted as recorded")
            && (second.contains("recovery: published as recorded")
                || second.contains("recovery: the publication's bind is there")),
        "recovery did not find the volume:\n{second}\nwhole log:\n{}",
        agent.log_text()
    );
    let mut node = agent.node().await;
    match node
        .node_get_volume_stats(stats_req(&vol.id, &target))
        .await
    {
        Ok(r) => {
            let r = r.into_inner();
            assert!(
                r.volume_condition.as_ref().is_none_or(|c| !c.abnormal),
                "{r:?}"
            );
        }
        Err(e) => fail("stats after the restart", e, agent.log_text()),
    }
    assert_eq!(
        std::fs::read(target.join("data")).unwrap(),
        b"kept across the restart"
    );
    if let Err(e) = node
        .node_unpublish_volume(unpublish_req(&vol, &target))
        .await
    {
        fail("unpublish", e, agent.log_text());
    }
    if let Err(e) = node.node_unstage_volume(unstage_req(&vol, &staging)).await {
        fail("unstage", e, agent.log_text());
    }
    assert!(
        mounts_below(&agent.work).is_empty(),
        "{:?}",
        mounts_below(&agent.work)
    );
    assert!(!target.exists(), "unpublish removes the target");
    assert!(
        std::fs::read_dir(&staging).map_or(true, |mut d| d.next().is_none()),
        "unstage leaves at most an empty staging directory"
    );
    let second = agent.log_text()[first.len()..].to_string();

    // Each process said once which fallbacks it takes, and nothing was refused.
    for (log, which) in [(&first, "first"), (&second, "after the restart")] {
        for &(syscall, expected) in fallbacks {
            let lines = fallback_lines(log, syscall);
            match expected {
                Some(n) => assert_eq!(lines, n, "{which}: {syscall}:\n{log}"),
                None => assert!(lines <= 1, "{which}: {syscall}:\n{log}"),
            }
        }
        // Asked of every namespace (its table is compared with the kernel's list of its
        // mounts): said once at most.
        assert!(
            fallback_lines(log, "listmount") <= 1,
            "{which}: listmount:\n{log}"
        );
        let bad: Vec<&str> = log
            .lines()
            .filter(|l| !l.contains("taking the fallback"))
            .filter(|l| {
                l.contains("refusing") || l.contains("not permitted") || l.contains(" failed")
            })
            .collect();
        assert!(bad.is_empty(), "{which}: {bad:#?}");
    }
    assert!(agent.terminate().await.expect("exits").success());
}

/// The shipped unit's syscall filter as this host's systemd builds it: `SystemCallFilter=` lines
/// expanded by `systemd-analyze syscall-filter`, everything else answered with
/// `SystemCallErrorNumber=`, names this libseccomp does not know left out (systemd ignores them
/// too, so on systemd 252 statmount and listmount get EPERM), plus the ENOSYS rule that
/// `RestrictNamespaces=` adds for clone3 (`RestrictSUIDSGID=` would add one for openat2; the unit
/// leaves it off). The agent and every tool
/// it runs (mkfs, fsck, resize2fs, xfs_growfs) serve the lifecycle under it, for ext4 and xfs.
#[tokio::test]
async fn the_units_syscall_filter_as_this_hosts_systemd_builds_it() {
    if !require_root("the_units_syscall_filter_as_this_hosts_systemd_builds_it") {
        return;
    }
    let unit = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../systemd/ebs-node-agent.service"),
    )
    .unwrap();
    let values = |key: &str| -> Vec<String> {
        unit.lines()
            .filter_map(|l| l.strip_prefix(&format!("{key}=")))
            .map(str::to_string)
            .collect()
    };
    let mut allowed = std::collections::BTreeSet::new();
    for line in values("SystemCallFilter") {
        let (deny, list) = match line.strip_prefix('~') {
            Some(rest) => (true, rest.to_string()),
            None => (false, line),
        };
        for word in list.split_whitespace() {
            for name in expand(word) {
                if deny {
                    allowed.remove(&name);
                } else {
                    allowed.insert(name);
                }
            }
        }
    }
    assert!(allowed.contains("mount") && !allowed.contains("ptrace"));
    let errno = match values("SystemCallErrorNumber").as_slice() {
        [e] if e == "EPERM" => EPERM,
        other => panic!("teach this test SystemCallErrorNumber={other:?}"),
    };
    // The unit keeps openat2 (see its comment): RestrictSUIDSGID= would answer it with ENOSYS.
    assert!(
        values("RestrictSUIDSGID").is_empty(),
        "RestrictSUIDSGID= blocks openat2"
    );
    let mut rules = Vec::new();
    if values("RestrictNamespaces").iter().any(|v| v != "no") {
        allowed.remove("clone3");
        rules.push((CLONE3, ENOSYS));
    }
    let allowed: Vec<String> = allowed.into_iter().collect();
    let rules = rules
        .iter()
        .map(|(nr, e)| format!("{nr}={e}"))
        .collect::<Vec<_>>()
        .join(",");
    filtered(&[]); // python3-seccomp is there
    let wrapper: Vec<OsString> = vec![
        "/usr/bin/python3".into(),
        "-c".into(),
        UNIT_FILTER.into(),
        errno.to_string().into(),
        allowed.join(",").into(),
        rules.into(),
    ];
    // statmount: denied where systemd or libseccomp does not know it (systemd 252 here);
    // openat2: used, never the fallback.
    let fallbacks = [("statmount", None), ("openat2", Some(0))];
    lifecycle(
        "unit-filter-ext4",
        wrapper.clone(),
        "ext4",
        64 << 20,
        &fallbacks,
    )
    .await;
    lifecycle("unit-filter-xfs", wrapper, "xfs", 320 << 20, &fallbacks).await;
}

/// Denies everything with argv[1]'s errno but the names in argv[2] (those libseccomp knows), and
/// answers the `nr=errno` pairs of argv[3]; then execs the rest.
const UNIT_FILTER: &str = "\
import os, sys, seccomp
f = seccomp.SyscallFilter(seccomp.ERRNO(int(sys.argv[1])))
for name in sys.argv[2].split(','):
    try:
        f.add_rule(seccomp.ALLOW, name)
    except Exception:
        pass
for pair in filter(None, sys.argv[3].split(',')):
    nr, errno = pair.split('=')
    f.add_rule(seccomp.ERRNO(int(errno)), int(nr))
f.load()
os.execv(sys.argv[4], sys.argv[4:])
";

/// The syscalls of a `SystemCallFilter=` word: a name, or a group expanded (recursively) by
/// `systemd-analyze syscall-filter`.
fn expand(word: &str) -> Vec<String> {
    if !word.starts_with('@') {
        return vec![word.to_string()];
    }
    let out = Command::new("systemd-analyze")
        .args(["syscall-filter", "--no-pager", word])
        .output()
        .expect("systemd-analyze (apt-get install systemd)");
    assert!(
        out.status.success(),
        "systemd-analyze syscall-filter {word}"
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .skip(1)
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .flat_map(expand)
        .collect()
}

/// `doctor` under the same filter names the filter, what it denies, and each fallback, without
/// failing: nothing the agent needs is missing.
#[test]
fn doctor_names_what_a_filter_denies_and_the_fallback() {
    if !require_root("doctor_names_what_a_filter_denies_and_the_fallback") {
        return;
    }
    let scratch = Scratch::new("filter-doctor");
    let doctor = |wrapper: Vec<OsString>| {
        let (program, args) = wrapper.split_first().unwrap();
        let out = Command::new(program)
            .args(args)
            .arg(agent_bin())
            .args(["doctor", "--backend", "loop", "--skip-imds", "--endpoint"])
            .arg(format!("unix://{}", scratch.join("run/csi.sock").display()))
            .arg("--state-dir")
            .arg(scratch.join("state"))
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (code, text) = doctor(filtered(&unit_like(ENOSYS)));
    assert_eq!(code, Some(0), "{text}");
    let seccomp = line_of(&text, "seccomp");
    assert!(
        seccomp.starts_with("warning ")
            && seccomp.contains("statmount (EPERM")
            && seccomp.contains("listmount (EPERM")
            && seccomp.contains("openat2 (ENOSYS"),
        "{seccomp}"
    );
    let statmount = line_of(&text, "statmount/listmount");
    assert!(
        statmount.starts_with("warning ") && statmount.contains("/proc/self/mountinfo"),
        "{statmount}"
    );
    let openat2 = line_of(&text, "openat2");
    assert!(
        openat2.starts_with("warning ") && openat2.contains("one component at a time"),
        "{openat2}"
    );

    // Without a filter (beyond what this test runs under) the same lines say so.
    if Path::new("/proc/self/status").exists()
        && std::fs::read_to_string("/proc/self/status")
            .unwrap()
            .contains("Seccomp:\t0")
    {
        let (code, text) = doctor(vec!["/usr/bin/env".into()]);
        assert_eq!(code, Some(0), "{text}");
        assert!(line_of(&text, "seccomp").starts_with("ok "), "{text}");
        assert!(line_of(&text, "openat2").starts_with("ok "), "{text}");
    }
}

fn line_of(text: &str, name: &str) -> String {
    text.lines()
        .find(|l| l.split_whitespace().nth(1) == Some(name))
        .unwrap_or_else(|| panic!("no {name} line in:\n{text}"))
        .to_string()
}
