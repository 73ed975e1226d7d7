//! A blank proof's answer, and how much of a block device the proof reads: the never-format
//! rule's evidence that a device holds nothing. The host crate's `blank` reads the device.

use std::fmt;

/// Windows spread evenly over a block device without a backing file, besides its ends and the
/// known superblock offsets: with them about 18 MiB, whatever the device's size.
pub const SPREAD_WINDOWS: u64 = 256;
/// The size of each spread window.
pub const SPREAD_WINDOW: u64 = 64 * 1024;

/// What the proof found that is not blank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NonBlank {
    /// The device offset of the first byte found (or first byte not proven).
    pub offset: u64,
    /// In words, for the refusal.
    pub what: String,
}

/// What a proof covered: said in the log and in a refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coverage {
    /// Every allocated byte of the backing file; `read` of them were read (allocated extents that
    /// must be proven zero).
    Allocated { read: u64 },
    /// `windows` windows, `read` bytes in all.
    Windows { windows: usize, read: u64 },
}

impl fmt::Display for Coverage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Coverage::Allocated { read } => write!(
                f,
                "the proof over every allocated byte of the volume file ({read} bytes read)"
            ),
            Coverage::Windows { windows, read } => write!(
                f,
                "the proof over {windows} windows of the device ({read} bytes read: the first and \
                 last MiB, the known superblock offsets, {SPREAD_WINDOWS} windows of {} KiB \
                 spread evenly)",
                SPREAD_WINDOW / 1024
            ),
        }
    }
}

/// A proof's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proof {
    /// None: every byte covered is zero.
    pub found: Option<NonBlank>,
    pub coverage: Coverage,
}
