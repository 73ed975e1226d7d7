//! `to_status`'s code for each error that was a string under a code's name (`NotFound(String)`,
//! `Aborted(String)`, …) before it was named for what went wrong: each keeps the code its call
//! site sent, and the words clients and tests read.

use std::path::PathBuf;
use std::time::Duration;

use tonic::Code;

use super::to_status;
use ebs_node_core::error::{CapacityError, ControllerError, Error};
use ebs_node_core::request::{FsType, ValidationError};

fn io() -> std::io::Error {
    std::io::Error::from_raw_os_error(libc::ENOSPC)
}

fn boxed() -> ebs_node_core::error::BoxedError {
    Box::new(std::io::Error::from_raw_os_error(libc::EBUSY))
}

fn ctl(e: ControllerError) -> Error {
    e.into()
}

fn cap(e: CapacityError) -> Error {
    e.into()
}

#[test]
fn each_named_error_keeps_its_call_sites_code_and_words() {
    let p = || PathBuf::from("/k/p");
    let v = || "vol".to_string();
    let table: Vec<(Error, Code, &str)> = vec![
        // Were NotFound(String).
        (
            Error::StagedVolumeNotFound { volume: v() },
            Code::NotFound,
            "vol is not staged on this node",
        ),
        (
            Error::DeviceNotAttached {
                backend: "node-local",
                volume: v(),
                device: p(),
                why: "no such device".into(),
            },
            Code::NotFound,
            "node-local volume vol: no such device; the volume is not attached to this node at /k/p",
        ),
        (
            Error::NotAnEbsVolumeId { volume: v() },
            Code::NotFound,
            "vol is not an EBS volume id (vol-<hex>)",
        ),
        (
            Error::DeviceNotAppeared {
                volume: v(),
                waited: Duration::from_millis(1500),
                model: "Amazon Elastic Block Store".into(),
                serial: "vol0abc".into(),
                seen: "no block disks".into(),
            },
            Code::NotFound,
            "volume vol did not appear within 1.5s: no NVMe device with model \"Amazon Elastic Block Store\" and serial vol0abc; seen: no block disks. Check that",
        ),
        (
            Error::NoSuchDisk { device: p() },
            Code::NotFound,
            "/k/p is no disk the kernel shows",
        ),
        (
            ctl(ControllerError::SnapshotNotFound { id: "ls-1".into() }),
            Code::NotFound,
            "snapshot ls-1 does not exist",
        ),
        (
            ctl(ControllerError::SourceNotFound {
                kind: "volume",
                id: "lv-1".into(),
            }),
            Code::NotFound,
            "source volume lv-1 does not exist",
        ),
        (
            ctl(ControllerError::UnknownNode {
                node: "n2".into(),
                serves: "n1".into(),
            }),
            Code::NotFound,
            "node \"n2\" does not exist: the loop backend serves only node \"n1\"",
        ),
        // Were Aborted(String).
        (
            Error::StatsInFlight {
                volume: v(),
                path: p(),
            },
            Code::Aborted,
            "a NodeGetVolumeStats call for volume vol at /k/p is still running",
        ),
        (
            Error::OperationPending {
                key: "vol-0abc".into(),
            },
            Code::Aborted,
            "an operation on vol-0abc is pending",
        ),
        (
            ctl(ControllerError::UnknownStartingToken { token: "x".into() }),
            Code::Aborted,
            "starting_token \"x\" is not a token this plugin gave out",
        ),
        (
            ctl(ControllerError::DeviceOfVolumeBusy { volume: v() }),
            Code::Aborted,
            "a node operation is using the device of volume vol right now",
        ),
        // Were AlreadyExists(String).
        (
            ctl(ControllerError::SnapshotNameTaken {
                name: "s".into(),
                existing: "ls-1".into(),
                of_volume: "lv-1".into(),
            }),
            Code::AlreadyExists,
            "snapshot \"s\" exists as ls-1, of volume lv-1",
        ),
        (
            ctl(ControllerError::VolumeNameTaken {
                name: "n".into(),
                existing: "lv-1".into(),
                bytes: 7,
            }),
            Code::AlreadyExists,
            "volume \"n\" exists as lv-1 with 7 bytes and other parameters or another source",
        ),
        (
            ctl(ControllerError::AttachedWithOtherReadonly {
                volume: v(),
                node: "n1".into(),
                readonly: false,
                asked: true,
            }),
            Code::AlreadyExists,
            "volume vol is already attached to node n1 with readonly=false; ControllerUnpublishVolume it before attaching it with readonly=true",
        ),
        // Were Precondition(String).
        (
            Error::StagingPathRequired,
            Code::FailedPrecondition,
            "staging_target_path is required",
        ),
        (
            Error::NodeIdentityUnknown {
                hint: "give --node-id".into(),
            },
            Code::FailedPrecondition,
            "give --node-id",
        ),
        (
            Error::ReadOnlyDeviceDidNotFollow {
                volume: v(),
                size: 9,
                device: p(),
                why: "EBUSY".into(),
            },
            Code::FailedPrecondition,
            "volume vol grew to 9 bytes, but its read-only block device /k/p (a publication's) did not follow: EBUSY",
        ),
        // Were OutOfRange(String).
        (
            cap(CapacityError::RequiredOverLimit {
                required: 2,
                limit: 1,
            }),
            Code::OutOfRange,
            "required_bytes 2 is larger than limit_bytes 1",
        ),
        (
            cap(CapacityError::WouldShrink {
                current: 2,
                limit: 1,
            }),
            Code::OutOfRange,
            "volumes are never shrunk",
        ),
        (
            cap(CapacityError::BeyondFileSize { required: 2 }),
            Code::OutOfRange,
            "more than a volume file can hold",
        ),
        (
            cap(CapacityError::NoAlignedSize {
                required: 1,
                limit: 2,
                sector: 512,
            }),
            Code::OutOfRange,
            "whole number of 512-byte sectors",
        ),
        (
            cap(CapacityError::SmallerThanSource {
                limit: 1,
                source_bytes: 2,
            }),
            Code::OutOfRange,
            "smaller than the source's 2 bytes",
        ),
        (
            cap(CapacityError::BelowMinimum { min: 1 }),
            Code::OutOfRange,
            "the loop backend's smallest volume is 1 bytes",
        ),
        (
            cap(CapacityError::BeyondInt64 { size: 1 }),
            Code::OutOfRange,
            "more than CSI can express (int64)",
        ),
        (
            cap(CapacityError::FilesystemLimit {
                fs: FsType::Ext3,
                source: "ext3 holds at most".into(),
            }),
            Code::OutOfRange,
            "ext3 holds at most",
        ),
        (
            cap(CapacityError::FileTooLarge {
                op: "making /k/p".into(),
                source: io(),
            }),
            Code::OutOfRange,
            "making /k/p: ",
        ),
        (
            cap(CapacityError::DeviceNotGrown {
                volume: v(),
                device: p(),
                size: 1,
                required: 2,
            }),
            Code::OutOfRange,
            "the device /k/p of volume vol has 1 bytes, fewer than the required 2",
        ),
        (
            cap(CapacityError::DeviceOverLimit {
                volume: v(),
                device: p(),
                size: 2,
                limit: 1,
            }),
            Code::OutOfRange,
            "the device /k/p of volume vol has 2 bytes, more than limit_bytes 1",
        ),
        // Were ResourceExhausted(String).
        (
            ctl(ControllerError::AttachLimitReached {
                node: "n1".into(),
                attached: 2,
                limit: 2,
            }),
            Code::ResourceExhausted,
            "node n1 already has 2 volumes attached, its limit (--volume-attach-limit 2)",
        ),
        (
            ctl(ControllerError::NoSpace {
                op: "copying /a to /b".into(),
                source: io(),
            }),
            Code::ResourceExhausted,
            "copying /a to /b: ",
        ),
        // Were Unimplemented(String).
        (
            Error::ReclaimOfBlockVolume { volume: v() },
            Code::Unimplemented,
            "volume vol is staged for block access",
        ),
        (
            Error::DiscardUnsupported { path: p() },
            Code::Unimplemented,
            "/k/p: the filesystem or device does not support discard; do not retry",
        ),
        (
            Error::TrimUnimplemented {
                path: p(),
                fs: "vfat".into(),
            },
            Code::Unimplemented,
            "/k/p: vfat does not implement FITRIM; do not retry",
        ),
        // Were Unavailable(String).
        (
            Error::Starting,
            Code::Unavailable,
            "the agent is starting (start-up recovery is running); retry shortly",
        ),
        (
            Error::BeingChecked { volume: v() },
            Code::Unavailable,
            "volume vol is being checked; retry shortly",
        ),
        (
            Error::BindsUnknown {
                op: "attaching /k/p".into(),
                why: "EACCES".into(),
            },
            Code::Unavailable,
            "attaching /k/p: no device number can be told free of binds: EACCES",
        ),
        (
            ctl(ControllerError::SourceNotReady {
                snapshot: "ls-1".into(),
            }),
            Code::Unavailable,
            "source snapshot ls-1 is still being taken; retry shortly",
        ),
        (
            ctl(ControllerError::CannotFreeze {
                device: p(),
                why: "EIO".into(),
            }),
            Code::Unavailable,
            "/k/p is mounted, but its filesystem cannot be frozen",
        ),
        // Were Internal(String).
        (
            Error::LoopDevice {
                op: "detaching /dev/loop9".into(),
                source: boxed(),
            },
            Code::Internal,
            "internal error: detaching /dev/loop9: ",
        ),
        (
            Error::Probe {
                device: p(),
                source: boxed(),
            },
            Code::Internal,
            "internal error: probing /k/p: ",
        ),
        (
            Error::ReadOnlyDeviceChanged {
                device: PathBuf::from("/dev/loop9"),
                over: p(),
            },
            Code::Internal,
            "internal error: /dev/loop9 changed right after it was laid over /k/p",
        ),
        (
            Error::AllocationUnreadable { volume: v() },
            Code::Internal,
            "the storage allocation of volume vol could not be read",
        ),
        (
            Error::DamagedRecord {
                record: "staged",
                volume: v(),
                source: ValidationError::Unsupported("fs".into()),
            },
            Code::Internal,
            "internal error: the staged record of vol is damaged: ",
        ),
        (
            Error::BlockingTaskFailed { source: boxed() },
            Code::Internal,
            "internal error: blocking task failed: ",
        ),
        (
            Error::Panicked {
                what: "the journal writer".into(),
            },
            Code::Internal,
            "internal error: the journal writer panicked",
        ),
    ];
    for (err, code, words) in table {
        let status = to_status(&err);
        assert_eq!(status.code(), code, "{err:?}");
        assert!(
            status.message().contains(words),
            "{words:?} missing from {:?}",
            status.message()
        );
    }
}

/// The sources the named errors keep are reachable through `std::error::Error::source`.
#[test]
fn named_errors_keep_their_source() {
    use std::error::Error as _;
    let errs: Vec<Error> = vec![
        Error::LoopDevice {
            op: "x".into(),
            source: boxed(),
        },
        Error::Probe {
            device: PathBuf::from("/k/p"),
            source: boxed(),
        },
        Error::BlockingTaskFailed { source: boxed() },
        ctl(ControllerError::NoSpace {
            op: "x".into(),
            source: io(),
        }),
        cap(CapacityError::FileTooLarge {
            op: "x".into(),
            source: io(),
        }),
        cap(CapacityError::FilesystemLimit {
            fs: FsType::Ext4,
            source: boxed(),
        }),
    ];
    for e in errs {
        assert!(e.source().is_some(), "{e:?} lost its source");
    }
}
