//! Pages built byte by byte from the documented layout (literal offsets, not the parser's
//! constants), so a wrong offset in the parser cannot hide behind the same wrong offset here.

use super::*;

fn put_u64(page: &mut [u8], at: usize, v: u64) {
    page[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

fn put_u32(page: &mut [u8], at: usize, v: u32) {
    page[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

/// Bins of `(lower, upper, count)` for the histogram at `at` (512: read, 2056: write).
fn put_histogram(page: &mut [u8], at: usize, bins: &[(u64, u64, u32)]) {
    put_u64(page, at, bins.len() as u64);
    for (i, (lower, upper, count)) in bins.iter().enumerate() {
        let b = at + 8 + 24 * i;
        put_u64(page, b, *lower);
        put_u64(page, b + 8, *upper);
        put_u32(page, b + 16, *count);
    }
}

/// A documented page with a distinct value in every field (the ith counter is 1000 + i) and
/// garbage in the reserved areas, which the parser must ignore.
fn documented_page() -> Vec<u8> {
    let mut page = vec![0u8; 4096];
    put_u32(&mut page, 0, 0x3C23_B510);
    put_u32(&mut page, 4, 1);
    for i in 0..11 {
        put_u64(&mut page, 8 + 8 * i, 1000 + i as u64);
    }
    page[96..512].fill(0xAB);
    page[3600..4096].fill(0xCD);
    put_histogram(&mut page, 512, &[(0, 8, 5), (8, 16, 3), (16, 32, 2)]);
    put_histogram(&mut page, 2056, &[(0, 128, 7), (128, 256, u32::MAX)]);
    page
}

#[test]
fn every_field_of_a_documented_page() {
    let s = parse(&documented_page()).unwrap();
    assert_eq!(s.total_read_ops, 1000);
    assert_eq!(s.total_write_ops, 1001);
    assert_eq!(s.total_read_bytes, 1002);
    assert_eq!(s.total_write_bytes, 1003);
    assert_eq!(s.total_read_time, 1004);
    assert_eq!(s.total_write_time, 1005);
    assert_eq!(s.ebs_volume_performance_exceeded_iops, 1006);
    assert_eq!(s.ebs_volume_performance_exceeded_tp, 1007);
    assert_eq!(s.ec2_instance_ebs_performance_exceeded_iops, 1008);
    assert_eq!(s.ec2_instance_ebs_performance_exceeded_tp, 1009);
    assert_eq!(s.volume_queue_length, 1010);
}

#[test]
fn histogram_bins_with_their_bounds_and_counts() {
    let s = parse(&documented_page()).unwrap();
    let bin = |lower, upper, count| Bin {
        lower,
        upper,
        count,
    };
    assert_eq!(
        s.read_io_latency_histogram,
        Histogram {
            num_bins: 3,
            bins: vec![bin(0, 8, 5), bin(8, 16, 3), bin(16, 32, 2)],
        }
    );
    // The count is 32 bits wide with 32 reserved bits after it.
    assert_eq!(
        s.write_io_latency_histogram.bins,
        vec![bin(0, 128, 7), bin(128, 256, u32::MAX)]
    );
    // Slots past num_bins are not bins, whatever they hold.
    let mut page = documented_page();
    put_u64(&mut page, 512, 1);
    let s = parse(&page).unwrap();
    assert_eq!(s.read_io_latency_histogram.bins, vec![bin(0, 8, 5)]);
}

#[test]
fn all_64_bins() {
    let mut page = documented_page();
    let bins: Vec<(u64, u64, u32)> = (0..64)
        .map(|i| (i << 4, (i + 1) << 4, u32::try_from(i).unwrap()))
        .collect();
    put_histogram(&mut page, 2056, &bins);
    let s = parse(&page).unwrap();
    assert_eq!(s.write_io_latency_histogram.bins.len(), 64);
    assert_eq!(s.write_io_latency_histogram.bins[63].upper, 64 << 4);
    assert_eq!(s.write_io_latency_histogram.bins[63].count, 63);
}

#[test]
fn bad_magic_is_not_an_ebs_volume() {
    let mut page = documented_page();
    put_u32(&mut page, 0, 0x1234_5678);
    assert_eq!(parse(&page), Err(PageError::BadMagic(0x1234_5678)));
    put_u32(&mut page, 0, 0xEC2C_0D7E);
    let err = parse(&page).unwrap_err();
    assert!(err.to_string().contains("instance-store"), "{err}");
    // All zeros: what a controller that fills nothing would leave.
    assert_eq!(parse(&[0u8; 4096]), Err(PageError::BadMagic(0)));
}

#[test]
fn short_page() {
    let page = documented_page();
    assert_eq!(parse(&page[..4095]), Err(PageError::Short(4095)));
    assert_eq!(parse(&page[..3600]), Err(PageError::Short(3600)));
    assert_eq!(parse(&[]), Err(PageError::Short(0)));
    // Longer pages (later versions append detail) parse from their first 4096 bytes.
    let mut long = page.clone();
    long.extend_from_slice(&[0xEE; 4096]);
    assert_eq!(parse(&long), parse(&page));
}

#[test]
fn histogram_bounds_are_checked() {
    type Bins = Vec<(u64, u64, u32)>;
    let cases: Vec<(usize, Bins, &str)> = vec![
        (512, vec![(8, 0, 1)], "backwards"),
        (2056, vec![(0, 8, 1), (4, 16, 1)], "not above"),
        (512, vec![(0, 8, 1), (8, 8, 1)], "not above"),
        (512, vec![(0, 16, 1), (16, 8, 1)], "backwards"),
    ];
    for (at, bins, want) in cases {
        let mut page = documented_page();
        put_histogram(&mut page, at, &bins);
        let err = parse(&page).unwrap_err();
        assert!(matches!(err, PageError::BadHistogram { .. }), "{bins:?}");
        assert!(err.to_string().contains(want), "{err} for {bins:?}");
    }
    let mut page = documented_page();
    put_u64(&mut page, 2056, 65);
    let err = parse(&page).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("write latency histogram: 65 bins"),
        "{err}"
    );
    put_u64(&mut page, 2056, u64::MAX);
    assert!(parse(&page).is_err());
}

#[test]
fn encode_writes_the_documented_layout() {
    let parsed = parse(&documented_page()).unwrap();
    let again = encode(&parsed);
    assert_eq!(parse(&again).unwrap(), parsed);
    let documented = documented_page();
    // Everything but the reserved areas (and the version word) is byte-identical.
    assert_eq!(again[0..4], documented[0..4]);
    assert_eq!(again[8..96], documented[8..96]);
    assert_eq!(again[512..3600], documented[512..3600]);
}
