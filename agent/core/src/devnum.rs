//! A block device's numbers, major:minor: how the kernel names a device in sysfs, in the mount
//! table and in `st_rdev`. A type of its own, so that a pair of numbers is never mistaken for
//! anything else (an inode pair, a size), and prints as the kernel writes it.

use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DevNum {
    pub major: u32,
    pub minor: u32,
}

impl DevNum {
    pub const fn new(major: u32, minor: u32) -> Self {
        DevNum { major, minor }
    }

    /// Parses the kernel's `major:minor` (sysfs `dev` files, mountinfo's third field).
    pub fn parse(text: &str) -> Option<Self> {
        let (major, minor) = text.trim().split_once(':')?;
        Some(DevNum::new(major.parse().ok()?, minor.parse().ok()?))
    }
}

impl fmt::Display for DevNum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.major, self.minor)
    }
}

/// The journal's records keep a device's numbers as a pair (their format predates this type).
impl From<(u32, u32)> for DevNum {
    fn from((major, minor): (u32, u32)) -> Self {
        DevNum::new(major, minor)
    }
}

impl From<DevNum> for (u32, u32) {
    fn from(d: DevNum) -> Self {
        (d.major, d.minor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_and_writes_as_the_kernel_does() {
        let d = DevNum::parse("259:12\n").expect("parses");
        assert_eq!(d, DevNum::new(259, 12));
        assert_eq!(d.to_string(), "259:12");
        assert_eq!(<(u32, u32)>::from(d), (259, 12));
        for bad in [
            "",
            "259",
            "259:",
            ":1",
            "a:b",
            "1:2:3",
            "-1:2",
            "4294967296:0",
        ] {
            assert_eq!(DevNum::parse(bad), None, "{bad:?}");
        }
    }
}
