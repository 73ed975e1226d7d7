//! `to_status`'s code for each of the node pipeline's named refusals, and the texts clients saw
//! before they had names.

use std::path::PathBuf;

use tonic::Code;

use super::{FormatError, FsToolError, to_status};
use ebs_node_core::error::Error;

/// The node pipeline's named refusals keep the codes the CSI spec gives them (they were
/// strings of a chosen code before they had names).
#[test]
fn each_named_refusal_has_its_csi_code() {
    let p = || PathBuf::from("/k/p");
    let v = || "vol".to_string();
    let io = || std::io::Error::from_raw_os_error(5);
    let table = [
        (Error::NotStaged { volume: v() }, Code::FailedPrecondition),
        (
            Error::StagedElsewhere {
                volume: v(),
                at: p(),
                asked: "/k/q".into(),
            },
            Code::FailedPrecondition,
        ),
        (
            Error::ForeignMount {
                path: p(),
                what: "tmpfs".into(),
                volume: v(),
            },
            Code::FailedPrecondition,
        ),
        (
            Error::ForeignStaging {
                path: p(),
                what: "tmpfs".into(),
                volume: v(),
            },
            Code::FailedPrecondition,
        ),
        (
            Error::StillPublished {
                volume: v(),
                targets: "/k/t".into(),
            },
            Code::FailedPrecondition,
        ),
        (
            Error::DeviceInUse {
                path: p(),
                why: "EBUSY".into(),
            },
            Code::FailedPrecondition,
        ),
        (
            Error::DeviceStillBound {
                device: p(),
                at: "bound at /c/xvda".into(),
            },
            Code::FailedPrecondition,
        ),
        (
            Error::StagedForOtherAccess { volume: v() },
            Code::FailedPrecondition,
        ),
        (
            Error::SinglePublication {
                volume: v(),
                at: p(),
            },
            Code::FailedPrecondition,
        ),
        (
            Error::NoLongerTheDevice {
                volume: v(),
                device: p(),
                reason: "r".into(),
            },
            Code::FailedPrecondition,
        ),
        (Error::StagingEmpty { path: p() }, Code::FailedPrecondition),
        (
            Error::UnusableTarget {
                path: p(),
                why: "exists and is not a directory",
            },
            Code::FailedPrecondition,
        ),
        (
            Error::AlreadyStagedAt {
                volume: v(),
                at: p(),
            },
            Code::AlreadyExists,
        ),
        (
            Error::StagedWithOtherCapability {
                volume: v(),
                at: p(),
            },
            Code::AlreadyExists,
        ),
        (
            Error::PublishedWithOtherArguments {
                volume: v(),
                path: p(),
            },
            Code::AlreadyExists,
        ),
        (
            Error::PublishedWithOtherReadonly {
                volume: v(),
                path: p(),
                readonly: true,
            },
            Code::AlreadyExists,
        ),
        (
            Error::MountedNotAsMade {
                volume: v(),
                path: p(),
                differs: "not nodev".into(),
            },
            Code::AlreadyExists,
        ),
        (
            Error::DeviceBusy {
                path: p(),
                devnum: ebs_node_core::DevNum::new(7, 3),
            },
            Code::Aborted,
        ),
        (
            Error::PathBusy {
                path: p(),
                volume: v(),
            },
            Code::Aborted,
        ),
        (Error::StillMounted { path: p() }, Code::Internal),
        (
            Error::CoveredMount {
                path: p(),
                found: "tmpfs".into(),
                expected: "volume vol".into(),
                what: "publication",
            },
            Code::FailedPrecondition,
        ),
        (
            Error::FilesystemInUse { volume: v() },
            Code::FailedPrecondition,
        ),
        (
            Error::StagingChanged {
                path: p(),
                volume: v(),
            },
            Code::FailedPrecondition,
        ),
        (
            Error::MountUnreadable {
                path: p(),
                source: io(),
            },
            Code::FailedPrecondition,
        ),
        (
            Error::PathUnexaminable {
                field: "target_path",
                path: p(),
                source: io(),
            },
            Code::FailedPrecondition,
        ),
        (
            Error::TargetNotCreated {
                path: p(),
                source: io(),
            },
            Code::FailedPrecondition,
        ),
        (
            Error::StagingNotCreated {
                path: p(),
                source: io(),
            },
            Code::FailedPrecondition,
        ),
        (
            Error::PathOfAnotherVolume {
                path: p(),
                how: "lies inside",
                usage: "staging path",
                volume: v(),
                theirs: "/k".into(),
            },
            Code::FailedPrecondition,
        ),
        (
            Error::Format(FormatError::NotBlank {
                device: p(),
                found: "xfs".into(),
            }),
            Code::FailedPrecondition,
        ),
        (
            Error::Format(FormatError::NothingToMount { volume: v() }),
            Code::FailedPrecondition,
        ),
        (
            Error::Format(FormatError::io("reading /k/p", std::io::Error::other("x"))),
            Code::Internal,
        ),
        (
            Error::FsTool(FsToolError::Unavailable {
                fs: ebs_node_core::request::FsType::Xfs,
                why: "no mkfs.xfs".into(),
            }),
            Code::FailedPrecondition,
        ),
        (
            Error::FsTool(FsToolError::FsckFailed {
                device: p(),
                code: 4,
                summary: "s".into(),
            }),
            Code::FailedPrecondition,
        ),
        (
            Error::FsTool(FsToolError::DoesNotFit {
                device: p(),
                why: "too small".into(),
            }),
            Code::OutOfRange,
        ),
        (
            Error::FsTool(FsToolError::ToolFailed {
                tool: "mkfs.ext4".into(),
                device: p(),
                code: 1,
                stderr: "e".into(),
            }),
            Code::Internal,
        ),
    ];
    for (err, code) in table {
        let st = to_status(&err);
        assert_eq!(st.code(), code, "{err}");
        assert_eq!(st.message(), err.to_string());
    }
    // The texts clients saw before the refusals had names.
    let still = Error::StillMounted { path: p() };
    assert_eq!(
        to_status(&still).message(),
        "internal error: /k/p is still mounted after repeated unmounts"
    );
    let busy = Error::DeviceBusy {
        path: p(),
        devnum: ebs_node_core::DevNum::new(7, 3),
    };
    assert_eq!(
        to_status(&busy).message(),
        "another operation is using device /k/p (7:3) right now; retry later"
    );
    // One wording for a wrong device, from the identity checks and from the format rule.
    let wrong = "refusing to use /k/p for volume vol: r; nothing was formatted or mounted";
    let identity = Error::WrongDevice {
        volume: v(),
        device: p(),
        reason: "r".into(),
    };
    let format = Error::Format(FormatError::WrongDevice {
        volume: v(),
        device: p(),
        reason: "r".into(),
    });
    for e in [identity, format] {
        assert_eq!(to_status(&e).message(), wrong);
        assert_eq!(to_status(&e).code(), Code::FailedPrecondition);
    }
}

/// The refusals named in this change say what their strings said (the CSI tests and operators
/// match on them).
#[test]
fn the_newly_named_refusals_keep_their_words() {
    let p = || PathBuf::from("/k/p");
    let eio = || std::io::Error::from_raw_os_error(5);
    let cases = [
        (
            Error::CoveredMount {
                path: p(),
                found: "a tmpfs mount of device 0:9".into(),
                expected: "volume vol".into(),
                what: "publication",
            },
            "/k/p holds a tmpfs mount of device 0:9, which is not volume vol: it covers or \
             replaced the volume's publication; not unmounting it",
        ),
        (
            Error::FilesystemInUse {
                volume: "vol".into(),
            },
            "the filesystem of volume vol is still mounted elsewhere (a publication the agent \
             has no record of?); its staging mount was removed, the volume stays staged until \
             nothing else uses it: unpublish it first",
        ),
        (
            Error::StagingChanged {
                path: p(),
                volume: "vol".into(),
            },
            "/k/p no longer holds volume vol's filesystem; it was left as it is",
        ),
        (
            Error::MountUnreadable {
                path: p(),
                source: eio(),
            },
            "cannot tell what is mounted at /k/p (Input/output error (os error 5)); refusing to \
             act on it",
        ),
        (
            Error::PathUnexaminable {
                field: "target_path",
                path: p(),
                source: eio(),
            },
            "target_path /k/p cannot be examined (Input/output error (os error 5)); refusing to \
             act on a path that cannot be proven safe (a dead NFS or FUSE mount above it?)",
        ),
        (
            Error::TargetNotCreated {
                path: p(),
                source: eio(),
            },
            "creating /k/p: Input/output error (os error 5)",
        ),
        (
            Error::StagingNotCreated {
                path: p(),
                source: eio(),
            },
            "staging path \"/k/p\": Input/output error (os error 5)",
        ),
        (
            Error::PathOfAnotherVolume {
                path: p(),
                how: "lies inside",
                usage: "staging path",
                volume: "vol".into(),
                theirs: "/k".into(),
            },
            "/k/p lies inside the staging path of volume vol (/k); a volume's paths never overlap \
             another's",
        ),
    ];
    for (err, text) in cases {
        assert_eq!(to_status(&err).message(), text);
    }
}

/// The expand, reclaim, attention and backend refusals that were strings keep their code and
/// their words.
#[test]
fn the_other_named_refusals_keep_their_code_and_words() {
    use ebs_node_core::DevNum;
    let p = || PathBuf::from("/k/p");
    let v = || "vol".to_string();
    let cases = [
        (
            Error::StagingIncomplete { volume: v() },
            "staging of volume vol has not completed; stage it again before expanding",
        ),
        (
            Error::NotTheVolumeAnyMore {
                volume: v(),
                device: p(),
                reason: "r".into(),
            },
            "the device /k/p of volume vol is not the volume any more (r); it cannot be expanded",
        ),
        (
            Error::GrowNeedsCapability {
                fs: ebs_node_core::request::FsType::Ext4,
                device: p(),
                stderr: "e".into(),
            },
            "growing the mounted ext4 filesystem on /k/p needs CAP_SYS_RESOURCE, which the agent \
             does not have (run it privileged, or grant the capability); resize2fs said: e",
        ),
        (
            Error::StagingNotMounted {
                volume: v(),
                at: p(),
            },
            "volume vol is recorded as staged at /k/p, but its filesystem is not mounted there \
             (the node rebooted, or it was unmounted behind the agent's back); stage it again \
             before expanding",
        ),
        (
            Error::MountedReadOnly {
                volume: v(),
                at: p(),
            },
            "the filesystem of volume vol is mounted read-only at /k/p; it cannot be grown online",
        ),
        (
            Error::ReadOnlyNoDiscard { path: p() },
            "/k/p is mounted read-only; free space cannot be discarded",
        ),
        (
            Error::NeedsAttention {
                volume: v(),
                reason: "r".into(),
                failed_checks: 2,
                when: "w".into(),
            },
            "volume vol needs attention: r; nothing was done (2 failed check(s) of its records \
             against the host; w); fix the cause, see `ebs-node-agent status`",
        ),
        (
            Error::VolumeInUse {
                volume: v(),
                why: "w".into(),
            },
            "volume vol is still in use on this node (w); NodeUnpublishVolume and \
             NodeUnstageVolume first",
        ),
        (
            Error::StillAttached {
                volume: v(),
                node: "n".into(),
                device: p(),
            },
            "volume vol is still attached to node n as /k/p; ControllerUnpublishVolume first",
        ),
        (
            Error::AttachedElsewhere {
                volume: v(),
                node: "n".into(),
            },
            "volume vol is attached to node n",
        ),
        (
            Error::NotAttached {
                volume: v(),
                file: p(),
            },
            "volume vol is not attached to this node (no loop device is backed by /k/p); call \
             ControllerPublishVolume first",
        ),
        (
            Error::IndistinctDevice {
                volume: v(),
                device: p(),
                why: "w".into(),
            },
            "volume vol: /k/p cannot be told apart from other devices: w",
        ),
        (
            Error::HostDisk {
                volume: v(),
                device: p(),
                devnum: DevNum::new(8, 1),
                what: "the root filesystem".into(),
            },
            "node-local volume vol: /k/p (8:1) is not free: its disk holds the root filesystem; \
             a host disk is never a volume",
        ),
        (
            Error::DiskClaimed {
                volume: v(),
                device: p(),
                disk: DevNum::new(8, 0),
            },
            "node-local volume vol: /k/p is in use (its disk 8:0 is claimed: a mount in another \
             namespace, swap, device-mapper or RAID); refusing to touch it",
        ),
        (
            Error::DeviceClaimed {
                device: p(),
                volume: v(),
                owner: "other".into(),
                door: "staged or published on this node",
            },
            "device /k/p of volume vol is held by volume other (staged or published on this \
             node); a device has one owner: release it there first (NodeUnstageVolume, \
             NodeUnpublishVolume or ControllerUnpublishVolume of other); nothing was changed",
        ),
        (
            Error::AnotherAgentsDevice {
                device: p(),
                volume: v(),
                level: "/dev/block/7:0".into(),
                evidence: "its loop device name \"ebsna-lo:0123456789abcdef:29d0ead3051e24c8\""
                    .into(),
            },
            "device /k/p of volume vol is another agent's: /dev/block/7:0 (its loop device name \
             \"ebsna-lo:0123456789abcdef:29d0ead3051e24c8\") is another ebs-node-agent's on this \
             host, whose records this agent cannot read; nothing was changed",
        ),
        (
            Error::AmbiguousSerial {
                volume: v(),
                serial: "s".into(),
                matches: "a, b".into(),
            },
            "volume vol (serial s) matches several devices: a, b; refusing to guess",
        ),
    ];
    for (err, text) in cases {
        let st = to_status(&err);
        assert_eq!(st.code(), Code::FailedPrecondition, "{err}");
        assert_eq!(st.message(), text);
    }
}
