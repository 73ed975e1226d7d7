//! Start-up's sweep of read-only block devices over the double: a device of this agent that no
//! publication record names is detached unless something uses it; one a record names, and
//! another agent's, are left. Root tests: `guards::ro_recovery`.

use super::*;
use crate::node::read_only::sweep;

#[test]
fn a_stray_is_detached_a_used_one_kept_and_a_recorded_one_or_anothers_left() {
    let h = Harness::new();
    h.staged_block(VOL, AccessMode::SingleNodeReaderOnly);
    let mut p = h.publish_cmd(VOL, "pod", block(AccessMode::SingleNodeReaderOnly));
    p.readonly = true;
    h.publish(&p).expect("a read-only block publication");
    let recorded = h.host.state().read_only[0].0;
    let under = h.host.state().read_only[0].1;
    let other = crate::node::ro_tag::AgentTag::new(9, std::path::Path::new("/other"));
    let tags = [
        (
            "stray",
            h.ctx.agent_tag.tag(VOL, std::path::Path::new("/gone")),
        ),
        (
            "used",
            h.ctx.agent_tag.tag(VOL, std::path::Path::new("/used")),
        ),
        (
            "another agent's",
            other.tag(VOL, std::path::Path::new("/x")),
        ),
    ];
    let mut devices = std::collections::HashMap::new();
    for (what, tag) in &tags {
        let path = h.host.add_device(&format!("ro-{what}"), GIB);
        let d = h.host.devnum(&path);
        let mut s = h.host.state();
        s.read_only.push((d, under));
        s.ro_tags.insert(d, tag.clone());
        devices.insert(*what, d);
    }
    // A workload's bind of the "used" device's node.
    let mut bind = crate::double::host::mount_facts(crate::DevNum::new(0, 5), "devtmpfs", true);
    bind.node.rdev = devices["used"];
    h.host
        .state()
        .mounts
        .insert(h.dir.join("elsewhere"), vec![bind]);
    h.host.state().calls.clear();
    let swept = sweep(&h.ctx).expect("sweep");
    assert_eq!((swept.detached, swept.adopted), (1, 1), "{swept:?}");
    let left: Vec<_> = h.host.state().read_only.iter().map(|(d, _)| *d).collect();
    assert!(!left.contains(&devices["stray"]), "the stray stayed");
    for kept in [recorded, devices["used"], devices["another agent's"]] {
        assert!(left.contains(&kept), "{kept} was detached");
    }
}

#[test]
fn a_sweep_with_no_stray_detaches_nothing() {
    let h = Harness::new();
    h.staged(VOL);
    let swept = sweep(&h.ctx).expect("sweep");
    assert_eq!((swept.detached, swept.adopted), (0, 0));
    assert_eq!(h.host.calls(), Vec::<String>::new());
}

#[test]
fn a_device_under_the_legacy_tag_of_a_recorded_publication_is_kept() {
    let h = Harness::new();
    h.staged_block(VOL, AccessMode::SingleNodeReaderOnly);
    let mut p = h.publish_cmd(VOL, "pod", block(AccessMode::SingleNodeReaderOnly));
    p.readonly = true;
    h.publish(&p).expect("a read-only block publication");
    // The agent before instance ids laid this publication's device under its legacy tag.
    let (ro, _) = h.host.state().read_only[0];
    let legacy = h.ctx.agent_tag.legacy_tag(VOL, h.target("pod").as_path());
    h.host.state().ro_tags.insert(ro, legacy);
    let swept = sweep(&h.ctx).expect("sweep");
    assert_eq!(swept.detached, 0, "{swept:?}");
    assert_eq!(h.host.state().read_only.len(), 1);
}
