//! Device resolution time over a fixture tree with 1 and with 40 NVMe disks (the Nitro maximum is
//! around 28 EBS volumes, plus instance-store disks). Run: cargo bench -p ebs-node-agent --bench ebs_resolve

use std::collections::HashMap;
use std::time::{Duration, Instant};

use ebs_node_backends::ebs::{EbsBackend, EbsConfig};
use ebs_node_core::ec2::ebs::EBS_MODEL;
use ebs_node_core::node::backend::Backend;
use ebs_node_core::request::VolumeId;
use ebs_node_fixture::Fixture;

fn median_resolve(disks: u32, device_path: bool) -> Duration {
    let f = Fixture::temp(&format!("bench-{disks}")).expect("fixture");
    for c in 0..disks {
        f.nvme(c, Some(&format!("vol0{c:016x}")), EBS_MODEL, &[1])
            .expect("disk");
    }
    // The wanted volume is the last one: every disk is read before it is found.
    let last = disks - 1;
    let volume = VolumeId::parse(&format!("vol-0{last:016x}")).expect("id");
    let mut publish = HashMap::new();
    if device_path {
        let link = f.link("xvdba", format!("nvme{last}n1")).expect("link");
        publish.insert("devicePath".to_string(), link.display().to_string());
    }
    let backend = EbsBackend::new(&EbsConfig {
        sys_root: f.sys_root(),
        dev_root: f.dev_root(),
        model: EBS_MODEL.into(),
        allow_unverified: false,
    });
    let mut times: Vec<Duration> = (0..200)
        .map(|_| {
            let t = Instant::now();
            backend
                .resolve(&volume, &publish, &HashMap::new(), Instant::now())
                .expect("resolve");
            t.elapsed()
        })
        .collect();
    times.sort();
    times[times.len() / 2]
}

fn main() {
    for disks in [1, 40] {
        for dp in [false, true] {
            let m = median_resolve(disks, dp);
            println!(
                "resolve with {disks:>2} NVMe disks{}: median {:.1} µs",
                if dp { " + devicePath link" } else { "" },
                m.as_secs_f64() * 1e6
            );
        }
    }
}
