//! Serial-less devices only by explicit choice, never a disk holding host filesystems; serials
//! matched exactly; identities asked by device number.

use ebs_node_core::DevNum;
use ebs_node_core::ec2::ebs::EBS_MODEL;
use ebs_node_fixture::Fixture;
use std::collections::HashMap;
use std::time::Instant;

use ebs_node_core::error::Error;
use ebs_node_core::records::DeviceIdentity;

use super::super::*;
use super::{SERIAL, VOL, backend, backend_unverified, nvme_identity, vol};

/// The numbers of the device the host's root filesystem lives on.
fn root_devnum() -> DevNum {
    use std::os::unix::fs::MetadataExt;
    ebs_node_host::device::devnum_of(std::fs::metadata("/").unwrap().dev())
}

#[test]
fn a_disk_holding_host_filesystems_is_never_taken_unverified() {
    let f = Fixture::temp("xen-root").unwrap();
    f.xen("xvda", 0).unwrap();
    let part = f.partition("xvda", 1).unwrap();
    // xvda1 carries the numbers of the device the host's / is mounted from.
    let DevNum {
        major: ma,
        minor: mi,
    } = root_devnum();
    let sys = std::fs::canonicalize(f.sys_root().join("block/xvda")).unwrap();
    std::fs::write(sys.join(&part).join("dev"), format!("{ma}:{mi}\n")).unwrap();
    let given = f.dev_root().join("xvda");
    let publish: HashMap<String, String> =
        HashMap::from([("devicePath".into(), given.to_str().unwrap().into())]);
    for ctx in [
        HashMap::new(),
        HashMap::from([("partition".to_string(), "1".to_string())]),
    ] {
        let err = backend_unverified(&f)
            .resolve(&vol(VOL), &publish, &ctx, Instant::now())
            .unwrap_err();
        assert!(matches!(err, Error::WrongDevice { .. }), "{err:?}");
        assert!(err.to_string().contains("mounted filesystem"), "{err}");
    }
}

#[test]
fn serials_match_exactly_never_as_substrings() {
    assert!(lookup::link_names_serial(
        "nvme-Amazon_Elastic_Block_Store_vol0abc",
        "vol0abc"
    ));
    assert!(lookup::link_names_serial(
        "nvme-Amazon_Elastic_Block_Store_vol0abc_1",
        "vol0abc"
    ));
    assert!(lookup::link_names_serial(
        "nvme-Amazon_Elastic_Block_Store_vol0abc-part2",
        "vol0abc"
    ));
    assert!(!lookup::link_names_serial(
        "nvme-Amazon_Elastic_Block_Store_vol0abcd",
        "vol0abc"
    ));
    assert!(!lookup::link_names_serial(
        "nvme-Amazon_Elastic_Block_Store_xvol0abc",
        "vol0abc"
    ));
    // A longer serial's by-id link does not make a shorter one's volume look stale.
    let f = Fixture::temp("serial-prefix").unwrap();
    let short = "vol0123456789abcdef";
    f.nvme(0, Some(SERIAL), EBS_MODEL, &[1]).unwrap();
    f.nvme(1, Some(short), EBS_MODEL, &[1]).unwrap();
    f.link(
        &format!("disk/by-id/nvme-Amazon_Elastic_Block_Store_{SERIAL}"),
        "../../nvme0n1",
    )
    .unwrap();
    let dev = backend(&f)
        .resolve(
            &vol("vol-0123456789abcdef"),
            &HashMap::new(),
            &HashMap::new(),
            Instant::now(),
        )
        .unwrap();
    assert_eq!(dev.path, f.dev_root().join("nvme1n1"));
}

#[test]
fn identify_by_device_number() {
    let f = Fixture::temp("identify").unwrap();
    f.nvme(0, Some(SERIAL), EBS_MODEL, &[1]).unwrap();
    f.xen("xvdf", 5).unwrap();
    let b = backend(&f);
    assert_eq!(b.identify(DevNum::new(259, 1)).unwrap(), nvme_identity());
    assert_eq!(
        b.identify(DevNum::new(202, 5)).unwrap(),
        DeviceIdentity::Unverified
    );
    assert!(b.identify(DevNum::new(259, 99)).is_err());
    assert_eq!(b.expected_identity(&vol(VOL)), Some(nvme_identity()));
    assert_eq!(b.expected_identity(&vol("lv-1")), None);
}
