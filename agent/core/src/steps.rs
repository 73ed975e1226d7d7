//! The journal's vocabulary: the operations it records and the named steps of each. The journal
//! writes these names (they are the state file's words and the step metric's labels), and the
//! crash matrix kills the agent at `op.step.phase` built from the same values, so a renamed step
//! cannot leave a crash point that is never reached.

use std::fmt;
use std::str::FromStr;

macro_rules! names {
    ($(#[$meta:meta])* $ty:ident { $($(#[$vmeta:meta])* $variant:ident = $name:literal,)+ }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum $ty {
            $($(#[$vmeta])* $variant,)+
        }

        impl $ty {
            pub const ALL: &[$ty] = &[$($ty::$variant,)+];

            /// The name the journal writes.
            pub const fn name(self) -> &'static str {
                match self {
                    $($ty::$variant => $name,)+
                }
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }

        impl FromStr for $ty {
            type Err = String;

            fn from_str(raw: &str) -> Result<Self, String> {
                $ty::ALL
                    .iter()
                    .copied()
                    .find(|v| v.name() == raw)
                    .ok_or_else(|| format!("unknown {} {raw:?}", stringify!($ty).to_lowercase()))
            }
        }
    };
}

names! {
    /// An operation on a volume, as the journal names it.
    Op {
        Stage = "stage",
        Publish = "publish",
        Unpublish = "unpublish",
        Unstage = "unstage",
        Expand = "expand",
        Reclaim = "reclaim",
    }
}

names! {
    /// A step of an operation: each is journaled before the host is touched and after.
    Step {
        /// Find the volume's device (stage).
        ResolveDevice = "resolve_device",
        /// Prove the device is the volume's (stage).
        VerifyIdentity = "verify_identity",
        /// Ask libblkid what the device carries (stage).
        Probe = "probe",
        /// mkfs, with the UUID chosen first (stage).
        Format = "format",
        /// e2fsck on an existing filesystem (stage).
        Check = "check",
        /// mount(2) at the staging path (stage).
        Mount = "mount",
        /// What else uses the device asked again once it is mounted (stage).
        Recheck = "recheck",
        /// Grow the filesystem to the device (stage, expand).
        Grow = "grow",
        /// The staged record complete (stage).
        Staged = "staged",
        /// A mount found there made read-only as asked, and nodev, before it was adopted: no
        /// longer written (a found mount is taken only as it is, `node::adopted`), still read in
        /// the journals of earlier versions.
        Restrict = "restrict",
        /// The bind onto the target path (publish).
        Bind = "bind",
        /// The read-only device laid over a raw block volume (publish).
        RoDevice = "ro_device",
        /// The publication record complete (publish).
        Published = "published",
        /// umount(2) of a target or the staging path (unpublish, unstage).
        Unmount = "unmount",
        /// The read-only device of a raw block publication removed (unpublish).
        DetachRoDevice = "detach_ro_device",
        /// The publication record removed (unpublish).
        Unpublished = "unpublished",
        /// The staged record removed (unstage).
        Unstaged = "unstaged",
        /// The device's new size read (expand).
        RefreshSize = "refresh_size",
        /// The expansion recorded (expand).
        Expanded = "expanded",
        /// syncfs before a trim (reclaim).
        Sync = "sync",
        /// FITRIM of the free space (reclaim).
        Trim = "trim",
        /// The reclaim recorded (reclaim).
        Reclaimed = "reclaimed",
    }
}

impl Step {
    /// Steps that only look at the host: a call that ended in them changed nothing there.
    pub const LOOKING: [Step; 2] = [Step::ResolveDevice, Step::VerifyIdentity];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_parses_back_and_names_are_unique() {
        for s in Step::ALL {
            assert_eq!(s.name().parse::<Step>(), Ok(*s));
            assert_eq!(Step::ALL.iter().filter(|o| o.name() == s.name()).count(), 1);
        }
        for o in Op::ALL {
            assert_eq!(o.name().parse::<Op>(), Ok(*o));
        }
        assert!("mkfs".parse::<Step>().is_err());
        assert_eq!(
            "Stage".parse::<Op>(),
            Err("unknown op \"Stage\"".to_string())
        );
    }
}
