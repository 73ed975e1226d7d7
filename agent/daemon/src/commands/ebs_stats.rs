//! `ebs-node-agent ebs-stats /dev/nvme1n1 [--json]`: one EBS volume's performance statistics
//! page, printed the way the Amazon plugin of nvme-cli prints it (`nvme amzn stats`), so an
//! operator can read a volume's counters and latency histograms on a node without nvme-cli.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use nix::errno::Errno;

use ebs_node_host::nvme::ReadError;
use ebs_node_host::nvme::ebs_page::{self, EbsStats, Histogram, LOG_ID};

#[derive(clap::Args, Debug)]
pub struct EbsStatsArgs {
    /// The volume's NVMe device: its namespace (/dev/nvme1n1) or its controller (/dev/nvme1).
    pub device: PathBuf,
    /// Print JSON, with the keys of `nvme amzn stats -o json`.
    #[arg(long)]
    pub json: bool,
    /// How long the controller may take to answer.
    #[arg(long, default_value = "10s", value_parser = ebs_node_core::config::parse_duration)]
    pub timeout: Duration,
}

pub fn run(args: EbsStatsArgs) -> i32 {
    match read(&args.device, args.timeout) {
        Ok(stats) if args.json => match serde_json::to_string_pretty(&stats) {
            Ok(json) => {
                println!("{json}");
                0
            }
            Err(e) => {
                eprintln!("error: {e}");
                1
            }
        },
        Ok(stats) => {
            print!("{}", text(&stats));
            0
        }
        Err(why) => {
            eprintln!("error: {}: {why}", args.device.display());
            1
        }
    }
}

/// Reads and parses the page. The ioctl runs on a thread of its own so that a controller that
/// never answers cannot hold the command past `timeout` (and a second).
pub fn read(device: &Path, timeout: Duration) -> Result<EbsStats, String> {
    let (tx, rx) = mpsc::channel();
    let dev = device.to_path_buf();
    std::thread::Builder::new()
        .name("ebs-stats".into())
        .spawn(move || {
            let _ = tx.send(ebs_page::read(&dev, timeout));
        })
        .map_err(|e| format!("starting the reader thread: {e}"))?;
    let page = match rx.recv_timeout(timeout + Duration::from_secs(1)) {
        Ok(Ok(page)) => page,
        Ok(Err(e)) => return Err(explain(&e)),
        Err(_) => return Err(format!("the controller did not answer within {timeout:?}")),
    };
    ebs_page::parse(&page).map_err(|e| e.to_string())
}

fn explain(e: &ReadError) -> String {
    match e {
        ReadError::Status(status) => format!(
            "the controller does not provide log page {LOG_ID:#04x} (NVMe status {status:#06x}): \
             not an EBS volume, or a controller without EBS detailed performance statistics"
        ),
        ReadError::Ioctl(Errno::ENOTTY | Errno::EINVAL) => {
            "not an NVMe device (the kernel has no NVMe passthrough for it)".into()
        }
        ReadError::Ioctl(Errno::EPERM | Errno::EACCES) => {
            "permission denied: NVMe admin commands need CAP_SYS_ADMIN (run as root)".into()
        }
        other => other.to_string(),
    }
}

/// The report in nvme-cli's layout (times in microseconds, as on the page).
pub fn text(s: &EbsStats) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "Total Ops:\n  Read: {}\n  Write: {}\n\
         Total Bytes:\n  Read: {}\n  Write: {}\n\
         Total Time (us):\n  Read: {}\n  Write: {}\n\n\
         EBS Volume Performance Exceeded (us):\n  IOPS: {}\n  Throughput: {}\n\n\
         EC2 Instance EBS Performance Exceeded (us):\n  IOPS: {}\n  Throughput: {}\n\n\
         Queue Length (point in time): {}\n\n",
        s.total_read_ops,
        s.total_write_ops,
        s.total_read_bytes,
        s.total_write_bytes,
        s.total_read_time,
        s.total_write_time,
        s.ebs_volume_performance_exceeded_iops,
        s.ebs_volume_performance_exceeded_tp,
        s.ec2_instance_ebs_performance_exceeded_iops,
        s.ec2_instance_ebs_performance_exceeded_tp,
        s.volume_queue_length,
    );
    histogram(
        &mut out,
        "Read IO Latency Histogram",
        &s.read_io_latency_histogram,
    );
    histogram(
        &mut out,
        "Write IO Latency Histogram",
        &s.write_io_latency_histogram,
    );
    out
}

fn histogram(out: &mut String, title: &str, h: &Histogram) {
    let rule = "=================================";
    let _ = writeln!(
        out,
        "{title}\n{rule}\nLower       Upper        IO Count\n{rule}"
    );
    for b in &h.bins {
        let _ = writeln!(out, "[{:<8} - {:<8}] => {}", b.lower, b.upper, b.count);
    }
    let _ = writeln!(out, "{rule}\n");
}

#[cfg(test)]
mod tests {
    use super::*;
    use ebs_node_host::nvme::ebs_page::Bin;

    fn sample() -> EbsStats {
        EbsStats {
            total_read_ops: 7,
            total_write_time: 1234,
            volume_queue_length: 3,
            read_io_latency_histogram: Histogram {
                num_bins: 2,
                bins: vec![
                    Bin {
                        lower: 0,
                        upper: 8,
                        count: 5,
                    },
                    Bin {
                        lower: 8,
                        upper: 16,
                        count: 2,
                    },
                ],
            },
            ..EbsStats::default()
        }
    }

    #[test]
    fn text_follows_nvme_cli() {
        let t = text(&sample());
        for line in [
            "Total Ops:\n  Read: 7\n  Write: 0\n",
            "Total Time (us):\n  Read: 0\n  Write: 1234\n",
            "Queue Length (point in time): 3\n",
            "Read IO Latency Histogram\n=================================\nLower       Upper        IO Count\n",
            "[0        - 8       ] => 5\n[8        - 16      ] => 2\n",
            "Write IO Latency Histogram\n",
        ] {
            assert!(t.contains(line), "{line:?} missing from:\n{t}");
        }
    }

    #[test]
    fn json_keys_are_nvme_clis() {
        let v = serde_json::to_value(sample()).unwrap();
        assert_eq!(v["total_read_ops"], 7);
        assert_eq!(v["ec2_instance_ebs_performance_exceeded_tp"], 0);
        assert_eq!(v["read_io_latency_histogram"]["num_bins"], 2);
        assert_eq!(
            v["read_io_latency_histogram"]["bins"][1],
            serde_json::json!({"lower": 8, "upper": 16, "count": 2})
        );
    }

    #[test]
    fn a_device_that_is_not_nvme_is_named_as_such() {
        let err = read(Path::new("/dev/null"), Duration::from_secs(2)).unwrap_err();
        assert!(err.starts_with("not an NVMe device"), "{err}");
        let err = explain(&ReadError::Status(0x4002));
        assert!(err.contains("log page 0xd0 (NVMe status 0x4002)"), "{err}");
    }
}
