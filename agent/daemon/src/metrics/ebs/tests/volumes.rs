//! Which volumes a scrape reads (the state file, the mount-point prefix) and which disks carry
//! them.

use super::*;

fn put_publication(store: &Store, volume: &str, target: &str) {
    let p = Publication {
        volume_id: volume.into(),
        target_path: target.into(),
        staging_path: staging_path(volume),
        block: false,
        readonly: false,
        access_mode: 1,
        mount_flags: vec![],
        progress: Progress::Complete,
        at_unix_ms: 0,
    };
    store
        .write(Durability::Lazy, |w| w.put_publication(&p))
        .unwrap();
}

#[test]
fn the_volume_set_is_what_was_staged_or_published_with_an_nvme_identity() {
    let mut env = Env::new("set", |_| {});
    env.staged("vol-0a", None);
    let mut partial = env.store.staged("vol-0a").unwrap().unwrap();
    partial.volume_id = "vol-0b".into();
    partial.identity = DeviceIdentity::NvmeSerial {
        serial: "vol0b".into(),
    };
    partial.progress = Progress::InProgress;
    let mut xen = partial.clone();
    xen.volume_id = "vol-0c".into();
    xen.identity = DeviceIdentity::Unverified;
    xen.progress = Progress::Complete;
    env.store
        .write(Durability::Lazy, |w| {
            w.put_staged(&partial)?;
            w.put_staged(&xen)
        })
        .unwrap();
    put_publication(
        &env.store,
        "vol-0d",
        "/var/lib/kubelet/pods/p/volumes/kubernetes.io~csi/pv/mount",
    );
    put_publication(&env.store, "vol-0c", "/var/lib/kubelet/pods/q/mount");
    put_publication(&env.store, "pvc-loop-1", "/var/lib/kubelet/pods/r/mount");
    let wanted = wanted_volumes(&env.store, None).unwrap();
    let want = |v: &str, s: &str| Wanted {
        volume_id: v.into(),
        serial: s.into(),
    };
    assert_eq!(
        wanted,
        vec![want("vol-0a", "vol0a"), want("vol-0d", "vol0d")]
    );
}

#[test]
fn the_mount_point_prefix_restricts_the_set_as_upstream_does() {
    let mut env = Env::new("prefix", |_| {});
    env.staged("vol-0a", None);
    put_publication(
        &env.store,
        "vol-0b",
        "/var/lib/kubelet/pods/p/volumes/kubernetes.io~csi/pv/mount",
    );
    put_publication(&env.store, "vol-0c", "/var/lib/kubeletx/pods/p/mount");
    let ids = |prefix: &str| -> Vec<String> {
        wanted_volumes(&env.store, Some(Path::new(prefix)))
            .unwrap()
            .into_iter()
            .map(|w| w.volume_id)
            .collect()
    };
    let plugin = "/var/lib/kubelet/plugins/kubernetes.io/csi/ebs.csi.aws.com/";
    assert_eq!(ids(plugin), vec!["vol-0a"]);
    assert_eq!(
        ids("/var/lib/kubelet/./plugins/../plugins/kubernetes.io/csi/ebs.csi.aws.com"),
        vec!["vol-0a"]
    );
    assert_eq!(ids("/var/lib/kubelet"), vec!["vol-0a", "vol-0b"]);
    // A path equal to the prefix is not under it; a sibling sharing its characters neither.
    assert!(ids(staging_path("vol-0a").to_str().unwrap()).is_empty());
    assert_eq!(ids("/var/lib/kubeletx"), vec!["vol-0c"]);
    assert_eq!(wanted_volumes(&env.store, None).unwrap().len(), 3);
}

#[test]
fn disks_are_found_by_serial_multipath_heads_included() {
    let env = Env::new("disks", |_| {});
    let f = &env.fixture;
    f.nvme(0, Some("vol0a"), EBS_MODEL, &[1]).unwrap();
    let head = f.nvme_multipath(1, 3, "vol0b", EBS_MODEL, 1).unwrap();
    f.nvme(4, Some("vol0c"), EBS_MODEL, &[1, 2]).unwrap();
    f.nvme(5, Some("vol0d"), "Amazon EC2 NVMe Instance Storage", &[1])
        .unwrap();
    f.nvme(6, Some("vol0e"), EBS_MODEL, &[1]).unwrap();
    f.xen("xvdf", 80).unwrap();
    let wanted: std::collections::HashSet<&str> =
        ["vol0a", "vol0b", "vol0c", "vol0d", "vol0x"].into();
    let found = disks_by_serial(&f.sys_root(), &wanted).unwrap();
    let names = |s: &str| -> Vec<&str> { found[s].iter().map(|d| d.name.as_str()).collect() };
    assert_eq!(names("vol0a"), vec!["nvme0n1"]);
    // The visible head, not the hidden per-path node nvme1c3n1.
    assert_eq!(names("vol0b"), vec![head.as_str()]);
    assert_eq!(names("vol0c"), vec!["nvme4n1"], "namespace 1 of two");
    assert_eq!(
        found["vol0d"][0].model.as_deref(),
        Some("Amazon EC2 NVMe Instance Storage")
    );
    assert!(!found.contains_key("vol0x") && !found.contains_key("vol0e"));
}
