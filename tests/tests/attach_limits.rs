//! MaxVolumesPerNode against the upstream EBS node's, for every instance type of the data file
//! the agent embeds (agent/data/ec2-ebs-attachment-limits.tsv), on a node with only its root
//! volume and 1 or 3 network interfaces. The expected value is computed here from the file with
//! the formula its header states, independently of the agent's parser; the agent's value comes
//! through the path NodeGetInfo takes (identity lookup, then the sysfs count at the call).

use std::path::Path;
use std::sync::Arc;

use ebs_node_agent::nodeinfo::NodeInfoSource;
use ebs_node_agent::nodeinfo::host_devices::{EBS_MODEL, fixture};
use ebs_node_agent::nodeinfo::sources::{Resolver, SourceConfig};
use ebs_tests::Scratch;

const DATA: &str = "../agent/data/ec2-ebs-attachment-limits.tsv";

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
    let mut r = Resolver::new(SourceConfig {
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
