//! Discovery over fixture trees: the layouts EC2 and the kernel produce, stale links, waiting.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use ebs_node_core::error::Error;
use ebs_node_core::records::DeviceIdentity;

use super::*;
use ebs_node_core::ec2::ebs::{EBS_MODEL, INSTANCE_STORE_MODEL};
use ebs_node_fixture::Fixture;

const VOL: &str = "vol-0123456789abcdef0";
const SERIAL: &str = "vol0123456789abcdef0";
const OTHER: &str = "vol0fedcba9876543210";

fn backend(f: &Fixture) -> EbsBackend {
    backend_with(f, false)
}

fn backend_unverified(f: &Fixture) -> EbsBackend {
    backend_with(f, true)
}

fn backend_with(f: &Fixture, allow_unverified: bool) -> EbsBackend {
    EbsBackend::new(&EbsConfig {
        sys_root: f.sys_root(),
        dev_root: f.dev_root(),
        model: EBS_MODEL.into(),
        allow_unverified,
    })
}

fn vol(id: &str) -> VolumeId {
    VolumeId::parse(id).unwrap()
}

fn resolve_with(
    f: &Fixture,
    publish: &[(&str, &str)],
    volume_ctx: &[(&str, &str)],
    wait: Duration,
) -> Result<ResolvedDevice> {
    let map = |kv: &[(&str, &str)]| -> HashMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    backend(f).resolve(
        &vol(VOL),
        &map(publish),
        &map(volume_ctx),
        Instant::now() + wait,
    )
}

fn resolve(f: &Fixture) -> Result<ResolvedDevice> {
    resolve_with(f, &[], &[], Duration::ZERO)
}

fn nvme_identity() -> DeviceIdentity {
    DeviceIdentity::NvmeSerial {
        serial: SERIAL.into(),
    }
}

#[test]
fn ebs_and_instance_store_side_by_side() {
    let f = Fixture::temp("side-by-side").unwrap();
    f.nvme(0, Some(OTHER), EBS_MODEL, &[1]).unwrap(); // root volume
    // An instance-store disk that (absurdly) carries the volume's serial is still never matched.
    f.nvme(1, Some(SERIAL), INSTANCE_STORE_MODEL, &[1]).unwrap();
    f.nvme(2, Some("AWS1A2B3C4D5E6F7"), INSTANCE_STORE_MODEL, &[1])
        .unwrap();
    f.nvme(3, Some(SERIAL), EBS_MODEL, &[1]).unwrap();
    let dev = resolve(&f).unwrap();
    assert_eq!(dev.path, f.dev_root().join("nvme3n1"));
    assert_eq!(dev.identity, nvme_identity());
}

#[test]
fn instance_store_alone_is_not_the_volume() {
    let f = Fixture::temp("store-only").unwrap();
    f.nvme(0, Some(SERIAL), INSTANCE_STORE_MODEL, &[1]).unwrap();
    let err = resolve(&f).unwrap_err().to_string();
    assert!(err.contains("Amazon EC2 NVMe Instance Storage"), "{err}");
}

#[test]
fn native_multipath_layout_uses_the_head_and_skips_hidden_paths() {
    let f = Fixture::temp("multipath").unwrap();
    f.nvme_multipath(0, 0, OTHER, EBS_MODEL, 1).unwrap();
    let head = f.nvme_multipath(1, 1, SERIAL, EBS_MODEL, 1).unwrap();
    let disks = SysfsDisks::new(f.sys_root(), f.dev_root()).disks().unwrap();
    let names: Vec<&str> = disks.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(
        names,
        ["nvme0n1", "nvme1n1"],
        "hidden nvmeXcYnZ paths are skipped"
    );
    let dev = resolve(&f).unwrap();
    assert_eq!(dev.path, f.dev_root().join(&head));
    // Growing rescans the controllers behind the subsystem.
    backend(&f).refresh_size(&dev.path).unwrap();
    assert!(f.rescan_requested(1));
    assert!(!f.rescan_requested(0));
}

#[test]
fn padded_and_nul_padded_identify_strings_match() {
    let f = Fixture::temp("padded").unwrap();
    f.nvme(0, Some(SERIAL), EBS_MODEL, &[1]).unwrap(); // pad40: spaces and a newline
    let model = f.sys_root().join("block/nvme0n1/device/model");
    std::fs::write(&model, format!("{EBS_MODEL}\0\0\0  \n")).unwrap();
    assert_eq!(resolve(&f).unwrap().path, f.dev_root().join("nvme0n1"));
}

#[test]
fn a_missing_serial_is_never_the_volume() {
    let f = Fixture::temp("no-serial").unwrap();
    f.nvme(0, None, EBS_MODEL, &[1]).unwrap();
    let err = resolve(&f).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("nvme0n1 (Amazon Elastic Block Store, no serial)"),
        "{text}"
    );
    // A serial-less disk behind devicePath is not taken on faith where EBS controllers exist.
    let link = f.link("xvdba", "nvme0n1").unwrap();
    let err = resolve_with(
        &f,
        &[("devicePath", link.to_str().unwrap())],
        &[],
        Duration::ZERO,
    );
    assert!(err.is_err());
}

#[test]
fn a_stale_device_path_link_is_refused() {
    let f = Fixture::temp("stale-link").unwrap();
    f.nvme(0, Some(OTHER), EBS_MODEL, &[1]).unwrap();
    f.nvme(1, Some(SERIAL), EBS_MODEL, &[1]).unwrap();
    let link = f.link("xvdba", "nvme0n1").unwrap();
    let err = resolve_with(
        &f,
        &[("devicePath", link.to_str().unwrap())],
        &[],
        Duration::ZERO,
    )
    .unwrap_err();
    assert!(matches!(err, Error::WrongDevice { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("xvdba") && text.contains(OTHER) && text.contains("stale"),
        "{text}"
    );
    assert!(text.contains("nothing was formatted or mounted"), "{text}");
    // The same link pointing at the right device is followed.
    f.link("xvdba", "nvme1n1").unwrap();
    let dev = resolve_with(
        &f,
        &[("devicePath", link.to_str().unwrap())],
        &[],
        Duration::ZERO,
    );
    assert_eq!(dev.unwrap().path, f.dev_root().join("nvme1n1"));
}

#[test]
fn a_stale_by_id_link_is_refused_even_without_device_path() {
    let f = Fixture::temp("stale-by-id").unwrap();
    f.nvme(0, Some(OTHER), EBS_MODEL, &[1]).unwrap();
    f.nvme(1, Some(SERIAL), EBS_MODEL, &[1]).unwrap();
    f.link(
        &format!("disk/by-id/nvme-Amazon_Elastic_Block_Store_{SERIAL}"),
        "../../nvme0n1",
    )
    .unwrap();
    let err = resolve(&f).unwrap_err();
    assert!(matches!(err, Error::WrongDevice { .. }), "{err:?}");
    assert!(err.to_string().contains("by-id"), "{err}");
}

#[test]
fn device_path_that_does_not_exist_yet_does_not_matter() {
    let f = Fixture::temp("absent-link").unwrap();
    f.nvme(0, Some(SERIAL), EBS_MODEL, &[1]).unwrap();
    let dev = resolve_with(
        &f,
        &[("devicePath", "/dev/xvdzz-not-here")],
        &[],
        Duration::ZERO,
    );
    assert_eq!(dev.unwrap().path, f.dev_root().join("nvme0n1"));
}

mod unverified;

#[test]
fn xen_uses_the_given_path_unverified_only_by_explicit_choice() {
    let f = Fixture::temp("xen").unwrap();
    f.xen("xvda", 0).unwrap();
    f.xen("xvdba", 1).unwrap();
    let given = f.dev_root().join("xvdba");
    let publish: HashMap<String, String> =
        HashMap::from([("devicePath".into(), given.to_str().unwrap().into())]);
    let err = backend(&f)
        .resolve(&vol(VOL), &publish, &HashMap::new(), Instant::now())
        .unwrap_err();
    assert!(
        err.to_string().contains("--allow-unverified-devices"),
        "without the flag a serial-less disk is never the volume: {err}"
    );
    let dev = backend_unverified(&f)
        .resolve(&vol(VOL), &publish, &HashMap::new(), Instant::now())
        .unwrap();
    assert_eq!(dev.path, given);
    assert_eq!(dev.identity, DeviceIdentity::Unverified);
}

#[test]
fn several_namespaces_on_one_controller_pick_namespace_one() {
    let f = Fixture::temp("namespaces").unwrap();
    f.nvme(0, Some(OTHER), EBS_MODEL, &[1, 2]).unwrap();
    f.nvme(1, Some(SERIAL), EBS_MODEL, &[2, 1, 3]).unwrap();
    assert_eq!(resolve(&f).unwrap().path, f.dev_root().join("nvme1n1"));
}

#[test]
fn the_partition_key_selects_a_partition_and_waits_for_it() {
    let f = Fixture::temp("partition").unwrap();
    f.nvme(0, Some(SERIAL), EBS_MODEL, &[1]).unwrap();
    let err = resolve_with(&f, &[], &[("partition", "2")], Duration::ZERO).unwrap_err();
    assert!(err.to_string().contains("has no partition 2"), "{err}");
    let name = f.partition("nvme0n1", 2).unwrap();
    assert_eq!(name, "nvme0n1p2");
    let dev = resolve_with(&f, &[], &[("partition", "2")], Duration::ZERO).unwrap();
    assert_eq!(dev.path, f.dev_root().join("nvme0n1p2"));
    assert!(
        backend(&f)
            .prove(Shown::Path(&dev.path, None), &nvme_identity())
            .is_ok()
    );
    let whole = resolve_with(&f, &[], &[("partition", "0")], Duration::ZERO).unwrap();
    assert_eq!(whole.path, f.dev_root().join("nvme0n1"));
    let bad = resolve_with(&f, &[], &[("partition", "x")], Duration::ZERO).unwrap_err();
    assert!(matches!(bad, Error::Invalid(_)), "{bad:?}");
}

#[test]
fn a_device_that_appears_two_seconds_later_is_found() {
    let f = Fixture::temp("late").unwrap();
    f.nvme(0, Some(OTHER), EBS_MODEL, &[1]).unwrap();
    let started = Instant::now();
    let dev = std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_secs(2));
            f.nvme(1, Some(SERIAL), EBS_MODEL, &[1]).unwrap();
        });
        resolve_with(&f, &[], &[], Duration::from_secs(20))
    })
    .unwrap();
    assert_eq!(dev.path, f.dev_root().join("nvme1n1"));
    assert!(started.elapsed() >= Duration::from_secs(2));
}

#[test]
fn a_device_that_never_appears_gives_a_clean_error_at_the_deadline() {
    let f = Fixture::temp("never").unwrap();
    f.nvme(0, Some(OTHER), EBS_MODEL, &[1]).unwrap();
    let started = Instant::now();
    let err = resolve_with(
        &f,
        &[("devicePath", "/dev/xvdba")],
        &[],
        Duration::from_secs(1),
    )
    .unwrap_err();
    assert!(started.elapsed() >= Duration::from_secs(1));
    assert!(matches!(err, Error::DeviceNotAppeared { .. }), "{err:?}");
    let text = err.to_string();
    for part in [
        VOL,
        SERIAL,
        "did not appear within 1.",
        OTHER,
        "/dev/xvdba does not exist",
        "Check that",
    ] {
        assert!(text.contains(part), "{part:?} missing from: {text}");
    }
}

#[test]
fn a_path_proof_notices_another_serial_under_the_name() {
    let f = Fixture::temp("still-is").unwrap();
    f.nvme(0, Some(SERIAL), EBS_MODEL, &[1]).unwrap();
    let dev = resolve(&f).unwrap();
    let b = backend(&f);
    assert!(b.prove(Shown::Path(&dev.path, None), &dev.identity).is_ok());
    f.set_serial(0, OTHER).unwrap();
    let why = b
        .prove(Shown::Path(&dev.path, None), &dev.identity)
        .unwrap_err();
    assert!(matches!(why, NotProven::Other(_)), "{why:?}");
    assert!(why.to_string().contains(OTHER), "{why}");
    f.remove("nvme0n1").unwrap();
    assert!(
        b.prove(Shown::Path(&dev.path, None), &dev.identity)
            .is_err()
    );
}

#[test]
fn volume_ids_that_are_not_ebs_ids_are_not_found() {
    assert_eq!(lookup::expected_serial(&vol(VOL)).unwrap(), SERIAL);
    for bad in ["pvc-123", "vol-", "vol-xyz"] {
        let err = lookup::expected_serial(&vol(bad)).unwrap_err();
        assert!(matches!(err, Error::NotAnEbsVolumeId { .. }), "{err:?}");
    }
}
