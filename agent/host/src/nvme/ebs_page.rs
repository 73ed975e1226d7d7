//! The EBS performance statistics log page (vendor log id 0xD0), as AWS documents it for
//! `nvme amzn stats` and `ebsnvme-stats`: 4096 bytes, little-endian, times in microseconds.
//!
//! | offset | size | field                                                       |
//! |-------:|-----:|-------------------------------------------------------------|
//! |      0 |    4 | magic 0x3C23B510 (instance-store pages carry 0xEC2C0D7E)    |
//! |      4 |    4 | version (reserved on older pages)                           |
//! |      8 | 11×8 | read ops, write ops, read bytes, write bytes, read time,    |
//! |        |      | write time, EBS IOPS exceeded, EBS throughput exceeded,     |
//! |        |      | EC2 IOPS exceeded, EC2 throughput exceeded, queue length    |
//! |     96 |  416 | reserved                                                    |
//! |    512 | 1544 | read latency histogram: bin count (8), 64 bins of 24 bytes: |
//! |        |      | lower (8), upper (8), count (4), reserved (4)               |
//! |   2056 | 1544 | write latency histogram, the same way                       |
//! |   3600 |  496 | reserved                                                    |

use std::path::Path;
use std::time::Duration;

use serde::Serialize;

use super::ReadError;

pub const LOG_ID: u8 = 0xD0;
/// EBS volumes have one namespace; the page is asked for on namespace 1, as nvme-cli does.
pub const NSID: u32 = 1;
pub const PAGE_LEN: usize = 4096;
pub const MAGIC: u32 = 0x3C23_B510;
/// What instance-store disks answer for the same log id: not an EBS volume.
pub const INSTANCE_STORE_MAGIC: u32 = 0xEC2C_0D7E;
pub const MAX_BINS: usize = 64;

const COUNTERS_AT: usize = 8;
const COUNTERS: usize = 11;
const READ_HISTOGRAM_AT: usize = 512;
const BIN_LEN: usize = 24;
const HISTOGRAM_LEN: usize = 8 + MAX_BINS * BIN_LEN;
const WRITE_HISTOGRAM_AT: usize = READ_HISTOGRAM_AT + HISTOGRAM_LEN;
const _: () = assert!(WRITE_HISTOGRAM_AT + HISTOGRAM_LEN + 496 == PAGE_LEN);

/// One latency bin: operations that completed in `lower..upper` microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Bin {
    pub lower: u64,
    pub upper: u64,
    pub count: u32,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Histogram {
    pub num_bins: u64,
    /// The first `num_bins` bins, in ascending order of their bounds.
    pub bins: Vec<Bin>,
}

/// A parsed page. Field names are the statistics' names in AWS's documentation (and the keys
/// of `nvme amzn stats -o json`); times are microseconds, the queue length a point in time.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct EbsStats {
    pub total_read_ops: u64,
    pub total_write_ops: u64,
    pub total_read_bytes: u64,
    pub total_write_bytes: u64,
    pub total_read_time: u64,
    pub total_write_time: u64,
    pub ebs_volume_performance_exceeded_iops: u64,
    pub ebs_volume_performance_exceeded_tp: u64,
    pub ec2_instance_ebs_performance_exceeded_iops: u64,
    pub ec2_instance_ebs_performance_exceeded_tp: u64,
    pub volume_queue_length: u64,
    pub read_io_latency_histogram: Histogram,
    pub write_io_latency_histogram: Histogram,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PageError {
    #[error("the page has {0} bytes, fewer than the {PAGE_LEN} of the EBS statistics page")]
    Short(usize),
    #[error("magic {0:#010x} is not EBS's {MAGIC:#010x}: not an EBS volume{hint}", hint = magic_hint(*.0))]
    BadMagic(u32),
    #[error("{histogram} latency histogram: {problem}")]
    BadHistogram {
        histogram: &'static str,
        problem: String,
    },
}

fn magic_hint(magic: u32) -> &'static str {
    if magic == INSTANCE_STORE_MAGIC {
        " (an instance-store disk)"
    } else {
        ""
    }
}

fn u64_at(page: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&page[at..at + 8]);
    u64::from_le_bytes(b)
}

fn u32_at(page: &[u8], at: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&page[at..at + 4]);
    u32::from_le_bytes(b)
}

/// Parses a page, checking its length, its magic and that each histogram's bin count fits the
/// 64 slots and its bins are ordered (`lower <= upper`, no overlap, upper bounds rising), so
/// every bin becomes a distinct bucket boundary.
pub fn parse(page: &[u8]) -> Result<EbsStats, PageError> {
    if page.len() < PAGE_LEN {
        return Err(PageError::Short(page.len()));
    }
    let magic = u32_at(page, 0);
    if magic != MAGIC {
        return Err(PageError::BadMagic(magic));
    }
    let c: Vec<u64> = (0..COUNTERS)
        .map(|i| u64_at(page, COUNTERS_AT + 8 * i))
        .collect();
    Ok(EbsStats {
        total_read_ops: c[0],
        total_write_ops: c[1],
        total_read_bytes: c[2],
        total_write_bytes: c[3],
        total_read_time: c[4],
        total_write_time: c[5],
        ebs_volume_performance_exceeded_iops: c[6],
        ebs_volume_performance_exceeded_tp: c[7],
        ec2_instance_ebs_performance_exceeded_iops: c[8],
        ec2_instance_ebs_performance_exceeded_tp: c[9],
        volume_queue_length: c[10],
        read_io_latency_histogram: histogram(page, READ_HISTOGRAM_AT, "read")?,
        write_io_latency_histogram: histogram(page, WRITE_HISTOGRAM_AT, "write")?,
    })
}

fn histogram(page: &[u8], at: usize, name: &'static str) -> Result<Histogram, PageError> {
    let bad = |problem: String| PageError::BadHistogram {
        histogram: name,
        problem,
    };
    let num_bins = u64_at(page, at);
    let Some(n) = usize::try_from(num_bins).ok().filter(|n| *n <= MAX_BINS) else {
        return Err(bad(format!(
            "{num_bins} bins, more than the {MAX_BINS} slots"
        )));
    };
    let mut bins: Vec<Bin> = Vec::with_capacity(n);
    for i in 0..n {
        let b = at + 8 + i * BIN_LEN;
        let bin = Bin {
            lower: u64_at(page, b),
            upper: u64_at(page, b + 8),
            count: u32_at(page, b + 16),
        };
        if bin.lower > bin.upper {
            return Err(bad(format!(
                "bin {i} runs backwards ({} to {} us)",
                bin.lower, bin.upper
            )));
        }
        if let Some(prev) = bins.last()
            && (bin.lower < prev.upper || bin.upper <= prev.upper)
        {
            return Err(bad(format!(
                "bin {i} ({} to {} us) is not above bin {} ({} to {} us)",
                bin.lower,
                bin.upper,
                i - 1,
                prev.lower,
                prev.upper
            )));
        }
        bins.push(bin);
    }
    Ok(Histogram { num_bins, bins })
}

/// The page for `stats`, as a controller would send it (tests, benches, fixtures).
pub fn encode(stats: &EbsStats) -> Vec<u8> {
    let mut page = vec![0u8; PAGE_LEN];
    page[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    let counters = [
        stats.total_read_ops,
        stats.total_write_ops,
        stats.total_read_bytes,
        stats.total_write_bytes,
        stats.total_read_time,
        stats.total_write_time,
        stats.ebs_volume_performance_exceeded_iops,
        stats.ebs_volume_performance_exceeded_tp,
        stats.ec2_instance_ebs_performance_exceeded_iops,
        stats.ec2_instance_ebs_performance_exceeded_tp,
        stats.volume_queue_length,
    ];
    for (i, v) in counters.iter().enumerate() {
        let at = COUNTERS_AT + 8 * i;
        page[at..at + 8].copy_from_slice(&v.to_le_bytes());
    }
    for (at, h) in [
        (READ_HISTOGRAM_AT, &stats.read_io_latency_histogram),
        (WRITE_HISTOGRAM_AT, &stats.write_io_latency_histogram),
    ] {
        page[at..at + 8].copy_from_slice(&h.num_bins.to_le_bytes());
        for (i, bin) in h.bins.iter().take(MAX_BINS).enumerate() {
            let b = at + 8 + i * BIN_LEN;
            page[b..b + 8].copy_from_slice(&bin.lower.to_le_bytes());
            page[b + 8..b + 16].copy_from_slice(&bin.upper.to_le_bytes());
            page[b + 16..b + 20].copy_from_slice(&bin.count.to_le_bytes());
        }
    }
    page
}

/// Reads and returns the raw page of the EBS volume whose NVMe device is `device`.
pub fn read(device: &Path, timeout: Duration) -> Result<Vec<u8>, ReadError> {
    super::read_log_page(device, NSID, LOG_ID, PAGE_LEN, timeout)
}

#[cfg(test)]
mod tests;
