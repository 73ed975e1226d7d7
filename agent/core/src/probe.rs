//! What libblkid says a device carries (the host crate's `blkid` asks it): the facts the
//! never-format rule (`format`) judges.

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signature {
    /// blkid `TYPE` (filesystem, raid, crypto, swap...) or, when no
    /// superblock was found, `PTTYPE` (e.g. "gpt", "dos").
    pub type_name: String,
    /// `UUID` for superblocks, `PTUUID` for partition tables.
    pub uuid: Option<String>,
    /// blkid `USAGE`: "filesystem", "raid", "crypto" or "other".
    pub usage: Option<String>,
    pub label: Option<String>,
    pub is_partition_table: bool,
    /// blkid `EXT_JOURNAL`: an ext3/ext4 whose journal lies on another device (its UUID). The
    /// kernel opens that device exclusively and writes to it at mount.
    pub external_journal: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeOutcome {
    /// libblkid recognised nothing. This is NOT proof of blankness (a
    /// damaged superblock is invisible to it); see `host::blank`.
    Blank,
    Found(Signature),
    /// Several conflicting signatures: the device must be treated as in use.
    Ambivalent,
}
