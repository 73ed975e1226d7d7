//! `to_status`'s code for each of the node pipeline's named refusals, and the texts clients saw
//! before they had names.

use std::path::PathBuf;

use tonic::Code;

use super::{FormatError, FsToolError, to_status};
use crate::error::Error;

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
            Error::DeviceBusy {
                path: p(),
                devnum: ebs_node_core::DevNum::new(7, 3),
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
            "/k/p no longer holds volume vol's filesystem; it was not grown",
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
