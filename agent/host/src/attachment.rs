//! Which attachment of a block device this is: the kernel's disk sequence number (Linux 5.15+;
//! a new number each time a disk appears, and each time a loop device is bound to a file), with
//! the boot's id, since the counter starts again at every boot. A format intent is worth
//! something only on the attachment it was journaled on (the core's `format`).

use ebs_node_core::DevNum;

/// `boot_id:diskseq` of the block device `major:minor` (a partition answers with its disk's);
/// None where the kernel does not say (before 5.15), which trusts no intent.
pub fn of(devnum: DevNum) -> Option<String> {
    let dir = format!("/sys/dev/block/{}", devnum);
    let seq = std::fs::read_to_string(format!("{dir}/diskseq"))
        .or_else(|_| std::fs::read_to_string(format!("{dir}/../diskseq")))
        .ok()?;
    let seq: u64 = seq.trim().parse().ok()?;
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    Some(format!("{}:{seq}", boot.trim()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_missing_device_says_nothing() {
        assert_eq!(
            super::of(ebs_node_core::DevNum::new(u32::MAX, u32::MAX)),
            None
        );
    }
}
