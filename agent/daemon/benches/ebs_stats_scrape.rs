//! One `/metrics` scrape (state gauges, EBS statistics, exposition) with 40 EBS volumes staged
//! over a sysfs fixture and a stubbed page reader, against the same scrape with no EBS volume,
//! measured in the same run. The stub answers at once (the agent's own cost: finding devices by
//! serial, a thread per read, parsing, rendering) or after 1 ms (a controller's answer time, to
//! show the reads overlapping). Run: cargo bench -p ebs-node-agent --bench ebs_stats_scrape

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ebs_node_agent::health::Health;
use ebs_node_agent::metrics::ebs::disks_by_serial;
use ebs_node_agent::metrics::ebs::{EbsStatsConfig, EbsStatsSource};
use ebs_node_agent::metrics::{Sources, render};
use ebs_node_backends::ebs::{BlockDevices, SysfsDisks};
use ebs_node_backends::nodeinfo::{NodeInfo, NodeInfoSource};
use ebs_node_core::ec2::ebs::EBS_MODEL;
use ebs_node_core::node::VolumeLocks;
use ebs_node_core::records::{AccessRecord, DeviceIdentity, Durability, Progress, StagedVolume};
use ebs_node_fixture::Fixture;
use ebs_node_host::nvme::ReadError;
use ebs_node_host::nvme::ebs_page::{self, Bin, EbsStats, Histogram};
use ebs_node_host::nvme::page_reads::PageReader;
use ebs_store::Store;

const VOLUMES: u32 = 40;
const ROUNDS: usize = 200;

struct StubReader {
    page: Vec<u8>,
    delay: Duration,
}

impl PageReader for StubReader {
    fn read_page(&self, _device: &Path) -> Result<Vec<u8>, ReadError> {
        if !self.delay.is_zero() {
            std::thread::sleep(self.delay);
        }
        Ok(self.page.clone())
    }
}

/// A page with 32 bins per histogram, as EBS fills them.
fn page() -> Vec<u8> {
    let bins: Vec<Bin> = (0..32u64)
        .map(|i| Bin {
            lower: if i == 0 { 0 } else { 1 << (i + 2) },
            upper: 1 << (i + 3),
            count: 1000 + i as u32,
        })
        .collect();
    let h = Histogram { num_bins: 32, bins };
    ebs_page::encode(&EbsStats {
        total_read_ops: 123_456_789,
        total_read_bytes: 987_654_321_000,
        total_read_time: 45_678_901,
        read_io_latency_histogram: h.clone(),
        write_io_latency_histogram: h,
        ..EbsStats::default()
    })
}

fn sources(f: &Fixture, state_dir: &Path, volumes: u32, delay: Duration) -> Sources {
    let _ = std::fs::remove_dir_all(state_dir);
    std::fs::create_dir_all(state_dir).expect("state dir");
    let store = Store::open(&state_dir.join("state.redb")).expect("store");
    store
        .write(Durability::Lazy, |w| {
            for c in 0..volumes {
                w.put_staged(&StagedVolume {
                    volume_id: format!("vol-0{c:016x}"),
                    staging_path: PathBuf::from(format!("/var/lib/kubelet/plugins/s/{c}")),
                    device: PathBuf::from(format!("/dev/nvme{c}n1")),
                    devnum: None,
                    identity: DeviceIdentity::NvmeSerial {
                        serial: format!("vol0{c:016x}"),
                    },
                    access: AccessRecord::Mount {
                        fs_type: "ext4".into(),
                        mount_flags: vec![],
                    },
                    access_mode: 1,
                    readonly: false,
                    progress: Progress::Complete,
                    at_unix_ms: 0,
                    attachment: None,
                })?;
            }
            Ok(())
        })
        .expect("staged records");
    let mut config = EbsStatsConfig::new(f.sys_root(), f.dev_root(), EBS_MODEL.into());
    config.min_interval = Duration::ZERO;
    let node = Arc::new(NodeInfoSource::known(NodeInfo {
        node_id: "i-0123456789abcdef0".into(),
        max_volumes: 0,
        topology: HashMap::new(),
    }));
    let reader = Arc::new(StubReader {
        page: page(),
        delay,
    });
    Sources {
        store: Arc::new(store),
        locks: VolumeLocks::default(),
        health: Arc::new(Health::default()),
        attention: Default::default(),
        ebs_stats: Some(EbsStatsSource::new(config, reader, node)),
    }
}

fn median(mut f: impl FnMut()) -> Duration {
    let mut times: Vec<Duration> = (0..ROUNDS)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect();
    times.sort();
    times[times.len() / 2]
}

/// Median time of a whole scrape, and the size of its text.
fn median_scrape(s: &Sources) -> (Duration, usize) {
    let mut size = 0;
    let mut times: Vec<Duration> = (0..ROUNDS)
        .map(|_| {
            let t = Instant::now();
            let text = render(&s.gauges());
            let took = t.elapsed();
            size = text.len();
            took
        })
        .collect();
    times.sort();
    (times[times.len() / 2], size)
}

fn main() {
    let f = Fixture::temp("bench-stats").expect("fixture");
    for c in 0..VOLUMES {
        f.nvme(c, Some(&format!("vol0{c:016x}")), EBS_MODEL, &[1])
            .expect("disk");
    }
    let base = std::env::temp_dir().join(format!("ebs-stats-bench-{}", std::process::id()));
    let none = sources(&f, &base.join("none"), 0, Duration::ZERO);
    let forty = sources(&f, &base.join("forty"), VOLUMES, Duration::ZERO);
    let slow = sources(&f, &base.join("slow"), VOLUMES, Duration::from_millis(1));
    // Warm-up: page cache of the fixture and the state files.
    for s in [&none, &forty, &slow] {
        let _ = render(&s.gauges());
    }
    let (t0, n0) = median_scrape(&none);
    let (t40, n40) = median_scrape(&forty);
    let (t40s, _) = median_scrape(&slow);
    let check = render(&forty.gauges());
    assert_eq!(
        check.matches("aws_ebs_csi_read_ops_total{").count(),
        VOLUMES as usize,
        "every volume exported"
    );
    // Parts of the 40-volume scrape: finding the disks in sysfs, and writing the text.
    let serials: Vec<String> = (0..VOLUMES).map(|c| format!("vol0{c:016x}")).collect();
    let wanted = serials.iter().map(String::as_str).collect();
    let t_sysfs = median(|| {
        let found = disks_by_serial(&f.sys_root(), &wanted).expect("disks");
        assert_eq!(found.len(), VOLUMES as usize);
    });
    // The backend's full scan (paths, device numbers), which the collector does not use.
    let disks = SysfsDisks::new(f.sys_root(), f.dev_root());
    let t_full = median(|| assert_eq!(disks.disks().expect("disks").len(), VOLUMES as usize));
    let ebs = forty.ebs_stats.as_ref().expect("collector");
    let scrape = ebs.scrape(&forty.store);
    let t_text = median(|| {
        let mut out = String::new();
        ebs_node_agent::metrics::ebs::render::render(&mut out, &scrape);
        assert!(out.len() > 1000);
    });
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "scrape, no EBS volume:                      median {:.3} ms ({n0} bytes)",
        ms(t0)
    );
    println!(
        "scrape, {VOLUMES} EBS volumes, instant reader:     median {:.3} ms ({n40} bytes), {:.1} x the scrape without",
        ms(t40),
        t40.as_secs_f64() / t0.as_secs_f64()
    );
    println!(
        "  of which: finding the {VOLUMES} disks by serial in sysfs {:.3} ms (the backend's full scan \
         would take {:.3} ms), writing their samples {:.3} ms",
        ms(t_sysfs),
        ms(t_full),
        ms(t_text)
    );
    println!(
        "scrape, {VOLUMES} EBS volumes, reader takes 1 ms:  median {:.3} ms, {:.1} x the scrape without (8 reads at a time)",
        ms(t40s),
        t40s.as_secs_f64() / t0.as_secs_f64()
    );
    drop((none, forty, slow));
    let _ = std::fs::remove_dir_all(&base);
}
