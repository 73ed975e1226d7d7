//! MaxVolumesPerNode against the upstream EBS node's, for every instance type of the data file
//! the agent embeds (agent/core/data/ec2-ebs-attachment-limits.tsv), on a node with only its root
//! volume and 1 or 3 network interfaces. The expected value is computed here from the file with
//! the formula its header states, independently of the agent's parser; the agent's value comes
//! through the path NodeGetInfo takes (identity lookup, then the sysfs count at the call).

use std::path::Path;
use std::sync::Arc;

use ebs_node_agent::nodeinfo::sources::{Resolver, SourceConfig};
use ebs_node_backends::nodeinfo::NodeInfoSource;
use ebs_node_core::ec2::ebs::EBS_MODEL;
use ebs_node_fixture::flat as fixture;
use ebs_tests::{Scratch, require_root, sh};

const DATA: &str = "../agent/core/data/ec2-ebs-attachment-limits.tsv";

struct Row {
    instance_type: String,
    limit: i64,
    shared: bool,
}

fn rows() -> (String, Vec<Row>) {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(DATA))
        .expect("the data file");
    let header: String = text
        .lines()
        .take_while(|l| l.starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n");
    let rows = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            assert_eq!(f.len(), 5, "{l}");
            Row {
                instance_type: f[0].to_string(),
                limit: f[1].parse().expect("limit"),
                shared: match f[2] {
                    "shared" => true,
                    "dedicated" => false,
                    other => panic!("budget {other} in {l}"),
                },
            }
        })
        .collect();
    (header, rows)
}

/// The header's formula, root volume only: minus (0 boot-time EBS mappings + 1), and for
/// shared types minus (ENIs - 1); at least 1.
fn upstream(limit: i64, shared: bool, enis: i64) -> i64 {
    let extra_enis = if shared { enis - 1 } else { 0 };
    (limit - 1 - extra_enis).max(1)
}

/// A sysfs tree with the root volume and `enis` interfaces.
fn host(scratch: &Scratch, enis: usize) -> std::path::PathBuf {
    let root = scratch.join(&format!("sys-{enis}"));
    fixture::nvme_disk(&root, "nvme0n1", EBS_MODEL, "vol0123456789abcdef0");
    for i in 0..enis {
        fixture::nic(&root, "ena", &format!("0000:00:{:02x}.0", 5 + i));
    }
    root
}

async fn agent_limit(sysfs: &Path, instance_type: &str) -> i64 {
    agent_limit_for(sysfs, instance_type, DRIVER).await
}

const DRIVER: &str = "ebs.csi.aws.com";

async fn agent_limit_for(sysfs: &Path, instance_type: &str, driver: &str) -> i64 {
    let mut r = Resolver::new(SourceConfig {
        driver_name: driver.into(),
        node_id: Some("i-0123456789abcdef0".into()),
        zone: Some("us-east-1a".into()),
        instance_type: Some(instance_type.into()),
        sysfs_root: sysfs.to_path_buf(),
        imds: None,
        ..Default::default()
    });
    let info = r.round().await.expect("identity from flags");
    let source = NodeInfoSource::missing(String::new());
    source.set_live(info, Arc::new(r.live_limit()));
    source.get().expect("node info").max_volumes
}

#[tokio::test]
async fn every_type_matches_upstream_with_1_and_3_interfaces() {
    let (header, rows) = rows();
    // The formula this test encodes is the one the header states.
    for phrase in [
        "subtracts (boot-time EBS mappings + 1)",
        "(ENIs - 1); minimum 1",
        "Xen types: 39, dedicated",
        "upstream uses 27, shared",
    ] {
        let flat = header.replace("\n# ", " ");
        assert!(
            flat.contains(phrase),
            "the header no longer says {phrase:?}"
        );
    }
    assert_eq!(rows.len(), 1102);
    let scratch = Scratch::new("attach-limits");
    let mut differ = Vec::new();
    for enis in [1, 3] {
        let sysfs = host(&scratch, enis);
        for row in &rows {
            let want = upstream(row.limit, row.shared, enis as i64);
            let got = agent_limit(&sysfs, &row.instance_type).await;
            if got != want {
                differ.push(format!(
                    "{} with {enis} ENIs: agent {got}, upstream {want}",
                    row.instance_type
                ));
            }
        }
        // A type the table lacks: 27, shared.
        let got = agent_limit(&sysfs, "zz9.plural").await;
        assert_eq!(got, upstream(27, true, enis as i64));
    }
    assert!(
        differ.is_empty(),
        "{} differences:\n{}",
        differ.len(),
        differ.join("\n")
    );
}

/// Issue 2796 upstream: after the upstream node plugin is swapped for the agent in place, the
/// volumes it staged are still attached and mounted at kubelet's staging paths. The scheduler
/// counts them already; reserving a slot for each as well would lower the limit twice. A disk
/// mounted at kubelet's staging path for this driver (a real mount of a real device whose numbers
/// the sysfs fixture gives) is not reserved; the root volume, and a disk mounted anywhere else or
/// for another driver, still are.
#[tokio::test]
async fn volumes_staged_by_the_upstream_plugin_before_a_swap_are_not_reserved() {
    if !require_root("volumes_staged_by_the_upstream_plugin_before_a_swap_are_not_reserved") {
        return;
    }
    let scratch = Scratch::new("attach-limits-swap");
    let img = scratch.join("upstream.img");
    sh(&format!(
        "truncate -s 64M {0} && mkfs.ext4 -q -F {0}",
        img.display()
    ));
    let out = sh(&format!("losetup --find --show {}", img.display()));
    let dev = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let out = sh(&format!("stat -c '%t %T' {dev}"));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let nums: Vec<u32> = text
        .split_whitespace()
        .map(|h| u32::from_str_radix(h, 16).expect("hex"))
        .collect();

    let sysfs = host(&scratch, 1);
    let root_only = agent_limit(&sysfs, "m7i.large").await;
    fixture::nvme_disk(&sysfs, "nvme1n1", EBS_MODEL, "vol0aaaaaaaaaaaaaaaa1");
    fixture::device_number(&sysfs, "nvme1n1", nums[0], nums[1]);
    // Attached, not in the journal, mounted nowhere: reserved (it may be the host's own disk).
    assert_eq!(agent_limit(&sysfs, "m7i.large").await, root_only - 1);

    let kubelet = scratch.join("kubelet/plugins/kubernetes.io/csi");
    let mount_at = |dir: &Path| {
        std::fs::create_dir_all(dir).expect("mount point");
        sh(&format!("mount {dev} {}", dir.display()));
    };
    // For another driver: still reserved.
    let theirs = kubelet.join("other.csi.example.com/0a1b/globalmount");
    mount_at(&theirs);
    assert_eq!(agent_limit(&sysfs, "m7i.large").await, root_only - 1);
    sh(&format!("umount {}", theirs.display()));
    // At kubelet's staging path for this driver, as the upstream plugin staged it: a CSI volume.
    let ours = kubelet.join(format!("{DRIVER}/9f86d081884c7d659a2f/globalmount"));
    mount_at(&ours);
    assert_eq!(agent_limit(&sysfs, "m7i.large").await, root_only);
    // The same disk seen by an agent with another driver name proves nothing.
    assert_eq!(
        agent_limit_for(&sysfs, "m7i.large", "other.csi.example.com").await,
        root_only - 1
    );
    sh(&format!("umount {} && losetup -d {dev}", ours.display()));
}

/// The rule in every layout kubelet uses for this driver, each with a real mount of a real
/// device: the older `…/csi/pv/<pv>/globalmount` (its vol_data.json names the driver), and a
/// block volume's device node bound at `…/volumeDevices/publish/<pv>/<pod>` (kubelet's
/// `volumeDevices/<pv>/data/vol_data.json` names it). The same mounts for another driver still
/// reserve a slot.
#[tokio::test]
async fn every_kubelet_layout_of_this_driver_proves_a_csi_volume_and_no_other() {
    if !require_root("every_kubelet_layout_of_this_driver_proves_a_csi_volume_and_no_other") {
        return;
    }
    let scratch = Scratch::new("attach-limits-layouts");
    let img = scratch.join("upstream.img");
    sh(&format!(
        "truncate -s 64M {0} && mkfs.ext4 -q -F {0}",
        img.display()
    ));
    let out = sh(&format!("losetup --find --show {}", img.display()));
    let dev = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let name = dev.trim_start_matches("/dev/").to_string();
    let out = sh(&format!("stat -c '%t %T' {dev}"));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let nums: Vec<u32> = text
        .split_whitespace()
        .map(|h| u32::from_str_radix(h, 16).expect("hex"))
        .collect();

    let sysfs = host(&scratch, 1);
    let root_only = agent_limit(&sysfs, "m7i.large").await;
    // Named as the kernel names the device: a block bind's root in devtmpfs is its name.
    fixture::nvme_disk(&sysfs, &name, EBS_MODEL, "vol0aaaaaaaaaaaaaaaa2");
    fixture::device_number(&sysfs, &name, nums[0], nums[1]);
    assert_eq!(agent_limit(&sysfs, "m7i.large").await, root_only - 1);

    let csi = scratch.join("kubelet/plugins/kubernetes.io/csi");
    let vol_data = |dir: &Path, driver: &str| {
        std::fs::create_dir_all(dir).expect("dir");
        std::fs::write(
            dir.join("vol_data.json"),
            format!(r#"{{"driverName":"{driver}","volumeHandle":"vol-0aaaaaaaaaaaaaaaa2"}}"#),
        )
        .expect("vol_data.json");
    };
    for (driver, reserved) in [("other.csi.example.com", 1), (DRIVER, 0)] {
        // The older filesystem layout.
        let pv = csi.join(format!("pv/pv-{}", driver.len()));
        vol_data(&pv, driver);
        let globalmount = pv.join("globalmount");
        std::fs::create_dir_all(&globalmount).expect("globalmount");
        sh(&format!("mount {dev} {}", globalmount.display()));
        assert_eq!(
            agent_limit(&sysfs, "m7i.large").await,
            root_only - reserved,
            "{driver}: pv/<pv>/globalmount"
        );
        sh(&format!("umount {}", globalmount.display()));

        // A block volume published to a pod: the device node bound onto a file.
        let spec = format!("pvb-{}", driver.len());
        vol_data(&csi.join(format!("volumeDevices/{spec}/data")), driver);
        let publish = csi.join(format!("volumeDevices/publish/{spec}/pod-uid-1"));
        std::fs::create_dir_all(publish.parent().expect("parent")).expect("publish dir");
        std::fs::write(&publish, b"").expect("publish file");
        sh(&format!("mount --bind {dev} {}", publish.display()));
        assert_eq!(
            agent_limit(&sysfs, "m7i.large").await,
            root_only - reserved,
            "{driver}: volumeDevices/publish/<pv>/<pod>"
        );
        sh(&format!("umount {}", publish.display()));
    }
    sh(&format!("losetup -d {dev}"));
}
