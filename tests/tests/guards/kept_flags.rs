//! A publication keeps the staging mount's nosuid, nodev and noexec, and its atime mode, with
//! and without the new mount API: open_tree clones the staging mount with its flags and
//! mount_setattr only adds the asked ones, while a bind remount (the fallback) sets nosuid,
//! nodev and noexec to exactly what it is given (a thirty-fifth fresh review's F1: without the
//! API, a read-only publication of a `nosuid,nodev,noexec` staging ran setuid binaries).

use ebs_tests::csi_req::*;
use ebs_tests::*;

use csi::volume_capability::access_mode::Mode;

use super::MIB;
use super::ro_peer::mount_options;

#[tokio::test]
async fn a_publication_keeps_the_staging_mounts_flags_with_and_without_the_mount_api() {
    let _ns = crate::NAMESPACE_COPY.read().await;
    if !require_root("a_publication_keeps_the_staging_mounts_flags_with_and_without_the_mount_api")
    {
        return;
    }
    use ebs_tests::seccomp::{ENOSYS, EPERM, MOUNT_SETATTR, MOVE_MOUNT, OPEN_TREE, filtered};
    let setups = [
        ("api", Vec::new()),
        ("no-setattr", filtered(&[(MOUNT_SETATTR, ENOSYS)])),
        (
            "no-api",
            filtered(&[
                (OPEN_TREE, EPERM),
                (MOVE_MOUNT, EPERM),
                (MOUNT_SETATTR, EPERM),
            ]),
        ),
    ];
    let staged_with = ["nosuid", "nodev", "noexec", "noatime"];
    for (name, wrapper) in setups {
        let scratch = Scratch::new(&format!("g-kept-{name}"));
        let mut agent = Agent::unstarted(&scratch, AgentOpts::default());
        agent.wrapper = wrapper;
        agent.spawn().await;
        let vol = create_attached(&agent, "kept", 64 * MIB).await;
        let staging = agent.work.join("staging/kept");
        let mut node = agent.node().await;
        let stage_cap = mount_cap_flags("ext4", Mode::SingleNodeWriter, &staged_with);
        node.node_stage_volume(stage_req(&vol, &staging, stage_cap))
            .await
            .expect("stage");
        // Read-only with no flag of its own; read-write with one more flag; read-write plain.
        let cases: [(&str, &[&str], bool, &str); 3] = [
            ("ro", &[], true, "ro"),
            ("sync", &["sync"], false, "rw"),
            ("plain", &[], false, "rw"),
        ];
        for (case, flags, readonly, mode) in cases {
            let target = agent.work.join(format!("pods/{case}/mount"));
            let cap = mount_cap_flags("ext4", Mode::SingleNodeWriter, flags);
            node.node_publish_volume(publish_req(&vol, &staging, &target, cap, readonly))
                .await
                .unwrap_or_else(|e| panic!("{name} publish {case}: {e:?}\n{}", agent.log_text()));
            let opts = mount_options(&target).unwrap_or_default();
            for want in staged_with.iter().chain(&[mode]) {
                assert!(
                    opts.iter().any(|o| o == want),
                    "{name}, {case}: the publication lacks {want}: {opts:?}"
                );
            }
            node.node_unpublish_volume(unpublish_req(&vol, &target))
                .await
                .expect("unpublish");
        }
        node.node_unstage_volume(unstage_req(&vol, &staging))
            .await
            .expect("unstage");
    }
}
