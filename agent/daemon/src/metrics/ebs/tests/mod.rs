//! The collector over a sysfs fixture and a state file, with a stubbed page reader: what reaches
//! `/metrics`, how failures are counted, deadlines, parallelism and the volume set.

mod deadlines;
mod formats;
mod upstream;
mod volumes;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ebs_node_core::records::{
    AccessRecord, DeviceIdentity, Durability, Progress, Publication, StagedVolume,
};
use nix::errno::Errno;

use super::*;
use ebs_node_backends::nodeinfo::NodeInfo;
use ebs_node_core::ec2::ebs::EBS_MODEL;
use ebs_node_fixture::Fixture;
use ebs_node_host::nvme::ebs_page::{Bin, Histogram, encode};

pub const INSTANCE: &str = "i-0123456789abcdef0";

type Answer = Arc<dyn Fn() -> Result<Vec<u8>, ReadError> + Send + Sync>;

/// Answers per device name; counts calls and the most reads seen at once.
#[derive(Default)]
pub struct Stub {
    answers: Mutex<HashMap<String, Answer>>,
    calls: AtomicUsize,
    now: AtomicUsize,
    most: AtomicUsize,
}

impl Stub {
    pub fn answer(
        &self,
        device: &str,
        f: impl Fn() -> Result<Vec<u8>, ReadError> + Send + Sync + 'static,
    ) {
        self.answers
            .lock()
            .unwrap()
            .insert(device.to_string(), Arc::new(f));
    }
}

impl PageReader for Stub {
    fn read_page(&self, device: &Path) -> Result<Vec<u8>, ReadError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        let name = device.file_name().unwrap().to_string_lossy().to_string();
        let answer = self.answers.lock().unwrap().get(&name).cloned();
        let out = match answer {
            Some(f) => f(),
            None => Ok(encode(&stats(1))),
        };
        self.now.fetch_sub(1, Ordering::SeqCst);
        out
    }
}

/// Statistics whose every field derives from `n`, with three read bins and two write bins.
pub fn stats(n: u64) -> EbsStats {
    let bin = |lower, upper, count| Bin {
        lower,
        upper,
        count,
    };
    EbsStats {
        total_read_ops: 100 * n,
        total_write_ops: 200 * n,
        total_read_bytes: 4096 * n,
        total_write_bytes: 8192 * n,
        total_read_time: 1_500_000 * n,
        total_write_time: 2_500_000 * n,
        ebs_volume_performance_exceeded_iops: 10 * n,
        ebs_volume_performance_exceeded_tp: 20 * n,
        ec2_instance_ebs_performance_exceeded_iops: 30 * n,
        ec2_instance_ebs_performance_exceeded_tp: 40 * n,
        volume_queue_length: n,
        read_io_latency_histogram: Histogram {
            num_bins: 3,
            bins: vec![bin(0, 8, 5), bin(8, 16, 3), bin(16, 1_000_000, 2)],
        },
        write_io_latency_histogram: Histogram {
            num_bins: 2,
            bins: vec![bin(0, 128, 7), bin(128, 256, 1)],
        },
    }
}

/// A sysfs fixture, a state file and a collector over them.
pub struct Env {
    pub fixture: Fixture,
    pub store: Store,
    pub stub: Arc<Stub>,
    pub source: EbsStatsSource,
    state_dir: PathBuf,
    next_ctrl: u32,
}

impl Env {
    pub fn new(name: &str, tune: impl FnOnce(&mut EbsStatsConfig)) -> Env {
        let fixture = Fixture::temp(&format!("stats-{name}")).unwrap();
        let state_dir =
            std::env::temp_dir().join(format!("ebs-stats-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&state_dir);
        std::fs::create_dir_all(&state_dir).unwrap();
        let store = Store::open(&state_dir.join("state.redb")).unwrap();
        let mut config =
            EbsStatsConfig::new(fixture.sys_root(), fixture.dev_root(), EBS_MODEL.into());
        config.min_interval = Duration::ZERO;
        tune(&mut config);
        let stub = Arc::new(Stub::default());
        let node = Arc::new(NodeInfoSource::known(NodeInfo {
            node_id: INSTANCE.into(),
            max_volumes: 0,
            topology: HashMap::new(),
        }));
        let source = EbsStatsSource::new(config, stub.clone(), node);
        Env {
            fixture,
            store,
            stub,
            source,
            state_dir,
            next_ctrl: 0,
        }
    }

    /// Stages `volume` (`vol-<hex>`) at a kubelet staging path, with a disk of `model` carrying
    /// its serial unless `model` is `None`; returns the disk's name.
    pub fn staged(&mut self, volume: &str, model: Option<&str>) -> String {
        let serial = serial_of(volume).unwrap();
        let ctrl = self.next_ctrl;
        self.next_ctrl += 1;
        let name = match model {
            Some(m) => self
                .fixture
                .nvme(ctrl, Some(&serial), m, &[1])
                .unwrap()
                .remove(0),
            None => format!("nvme{ctrl}n1"),
        };
        let record = StagedVolume {
            volume_id: volume.into(),
            staging_path: staging_path(volume),
            device: PathBuf::from("/dev").join(&name),
            devnum: None,
            identity: DeviceIdentity::NvmeSerial { serial },
            access: AccessRecord::Mount {
                fs_type: "ext4".into(),
                mount_flags: vec![],
            },
            access_mode: 1,
            readonly: false,
            progress: Progress::Complete,
            at_unix_ms: 0,
            attachment: None,
        };
        self.store
            .write(Durability::Lazy, |w| w.put_staged(&record))
            .unwrap();
        name
    }

    pub fn scrape(&self) -> (EbsScrape, String) {
        let s = self.source.scrape(&self.store);
        let mut text = String::new();
        super::render::render(&mut text, &s);
        (s, text)
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.state_dir);
    }
}

pub fn staging_path(volume: &str) -> PathBuf {
    PathBuf::from("/var/lib/kubelet/plugins/kubernetes.io/csi/ebs.csi.aws.com")
        .join(volume)
        .join("globalmount")
}

pub fn reasons(s: &EbsScrape) -> HashMap<&'static str, u64> {
    s.errors_by_reason
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(r, n)| (r.as_str(), *n))
        .collect()
}

#[test]
fn each_staged_volume_is_read_by_its_serial() {
    let mut env = Env::new("read", |_| {});
    let a = env.staged("vol-0aaaaaaaaaaaaaaaa", Some(EBS_MODEL));
    let b = env.staged("vol-0bbbbbbbbbbbbbbbb", Some(EBS_MODEL));
    env.stub.answer(&a, || Ok(encode(&stats(1))));
    env.stub.answer(&b, || Ok(encode(&stats(2))));
    let (s, text) = env.scrape();
    assert_eq!(s.instance_id, INSTANCE);
    assert_eq!(
        s.volumes
            .iter()
            .map(|(v, st)| (v.as_str(), st.total_read_ops))
            .collect::<Vec<_>>(),
        vec![
            ("vol-0aaaaaaaaaaaaaaaa", 100),
            ("vol-0bbbbbbbbbbbbbbbb", 200)
        ]
    );
    let labels = format!("instance_id=\"{INSTANCE}\",volume_id=\"vol-0bbbbbbbbbbbbbbbb\"");
    for line in [
        format!("aws_ebs_csi_read_ops_total{{{labels}}} 200\n"),
        format!("aws_ebs_csi_read_seconds_total{{{labels}}} 3\n"),
        format!("aws_ebs_csi_write_seconds_total{{{labels}}} 5\n"),
        format!("aws_ebs_csi_exceeded_iops_seconds_total{{{labels}}} 2e-05\n"),
        format!("aws_ebs_csi_ec2_exceeded_tp_seconds_total{{{labels}}} 8e-05\n"),
        format!("aws_ebs_csi_volume_queue_length{{{labels}}} 2\n"),
        format!("aws_ebs_csi_read_io_latency_seconds_bucket{{{labels},le=\"8e-06\"}} 5\n"),
        format!("aws_ebs_csi_read_io_latency_seconds_bucket{{{labels},le=\"1.6e-05\"}} 8\n"),
        format!("aws_ebs_csi_read_io_latency_seconds_bucket{{{labels},le=\"1\"}} 10\n"),
        format!("aws_ebs_csi_read_io_latency_seconds_bucket{{{labels},le=\"+Inf\"}} 10\n"),
        format!("aws_ebs_csi_read_io_latency_seconds_sum{{{labels}}} 0\n"),
        format!("aws_ebs_csi_read_io_latency_seconds_count{{{labels}}} 10\n"),
        format!("aws_ebs_csi_write_io_latency_seconds_bucket{{{labels},le=\"0.000256\"}} 8\n"),
        format!("aws_ebs_csi_nvme_collector_scrapes_total{{instance_id=\"{INSTANCE}\"}} 1\n"),
        format!("aws_ebs_csi_nvme_collector_errors_total{{instance_id=\"{INSTANCE}\"}} 0\n"),
        format!(
            "aws_ebs_csi_nvme_collector_duration_seconds_count{{instance_id=\"{INSTANCE}\"}} 1\n"
        ),
    ] {
        assert!(text.contains(&line), "{line:?} missing from:\n{text}");
    }
    // Disks are found by serial: the devices read are the ones the fixture gave these serials.
    assert_eq!(env.stub.calls.load(Ordering::SeqCst), 2);
}

#[test]
fn failures_are_counted_and_never_fatal() {
    let mut env = Env::new("fail", |_| {});
    env.staged("vol-01", Some(EBS_MODEL));
    env.staged("vol-02", None);
    env.staged("vol-03", Some("Amazon EC2 NVMe Instance Storage"));
    let cases: [(&str, Answer); 6] = [
        ("vol-04", Arc::new(|| Err(ReadError::Status(0x4002)))),
        ("vol-05", Arc::new(|| Err(ReadError::Ioctl(Errno::EPERM)))),
        (
            "vol-06",
            Arc::new(|| Ok(encode(&stats(1))[..3000].to_vec())),
        ),
        ("vol-07", Arc::new(|| Ok(vec![0u8; 4096]))),
        ("vol-08", Arc::new(|| Err(ReadError::Ioctl(Errno::ENOTTY)))),
        (
            "vol-09",
            Arc::new(|| {
                let mut page = encode(&stats(1));
                page[512..520].copy_from_slice(&65u64.to_le_bytes());
                Ok(page)
            }),
        ),
    ];
    for (volume, answer) in cases {
        let disk = env.staged(volume, Some(EBS_MODEL));
        env.stub.answers.lock().unwrap().insert(disk, answer);
    }
    let (s, text) = env.scrape();
    assert_eq!(s.volumes.len(), 1, "only vol-01 is readable");
    assert!(text.contains("volume_id=\"vol-01\""));
    assert!(!text.contains("volume_id=\"vol-02\""));
    assert_eq!(s.errors, 8);
    let want: HashMap<&str, u64> = [
        ("no_device", 1),
        ("not_ebs", 2),
        ("unsupported", 1),
        ("permission", 1),
        ("short_page", 1),
        ("not_nvme", 1),
        ("bad_page", 1),
    ]
    .into();
    assert_eq!(reasons(&s), want);
    assert!(text.contains(&format!(
        "aws_ebs_csi_nvme_collector_errors_total{{instance_id=\"{INSTANCE}\"}} 8\n"
    )));
    assert!(text.contains("ebs_agent_ebs_stats_errors_total{reason=\"unsupported\"} 1\n"));
    assert!(text.contains("ebs_agent_ebs_stats_errors_total{reason=\"timeout\"} 0\n"));
    // Counters accumulate over scrapes, as upstream's do.
    let (s, _) = env.scrape();
    assert_eq!((s.scrapes, s.errors), (2, 16));
}

#[test]
fn a_recent_scrape_is_reused_within_the_minimum_interval() {
    let mut env = Env::new("interval", |c| c.min_interval = Duration::from_secs(3600));
    env.staged("vol-0c", Some(EBS_MODEL));
    env.scrape();
    let (s, _) = env.scrape();
    assert_eq!(env.stub.calls.load(Ordering::SeqCst), 1);
    assert_eq!((s.scrapes, s.volumes.len(), s.duration.count), (2, 1, 2));
}

#[test]
fn the_instance_id_label_follows_the_node_identity() {
    let env = Env::new("noid", |_| {});
    let node = Arc::new(NodeInfoSource::missing("looking up".into()));
    let config = EbsStatsConfig::new(
        env.fixture.sys_root(),
        env.fixture.dev_root(),
        EBS_MODEL.into(),
    );
    let source = EbsStatsSource::new(config, Arc::new(Stub::default()), node.clone());
    assert_eq!(source.scrape(&env.store).instance_id, "");
    node.set(NodeInfo {
        node_id: "i-0f".into(),
        max_volumes: 0,
        topology: HashMap::new(),
    });
    assert_eq!(source.scrape(&env.store).instance_id, "i-0f");
}
