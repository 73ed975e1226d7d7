//! Sizes out of range: what CreateVolume, ControllerExpandVolume and NodeExpandVolume ask for
//! that no volume, device or file can take (all OUT_OF_RANGE, chosen in `grpc::to_status`).

use std::path::PathBuf;

use crate::request::FsType;

#[derive(Debug, thiserror::Error)]
pub enum CapacityError {
    #[error("required_bytes {required} is larger than limit_bytes {limit}")]
    RequiredOverLimit { required: u64, limit: u64 },
    #[error(
        "the volume already has {current} bytes, more than limit_bytes {limit}; volumes are \
         never shrunk"
    )]
    WouldShrink { current: u64, limit: u64 },
    #[error("required_bytes {required} is more than a volume file can hold")]
    BeyondFileSize { required: u64 },
    #[error(
        "no size between required_bytes {required} and limit_bytes {limit} is a whole number of \
         {sector}-byte sectors"
    )]
    NoAlignedSize {
        required: u64,
        limit: u64,
        sector: u64,
    },
    #[error(
        "limit_bytes {limit} is smaller than the source's {source_bytes} bytes: a volume made \
         from a snapshot or a clone is at least as large as its source"
    )]
    SmallerThanSource { limit: u64, source_bytes: u64 },
    #[error("the loop backend's smallest volume is {min} bytes")]
    BelowMinimum { min: u64 },
    #[error("{size} bytes is more than CSI can express (int64)")]
    BeyondInt64 { size: u64 },
    /// A filesystem the volume may be formatted with cannot span that size (`fs_limits`).
    #[error("{source}")]
    FilesystemLimit {
        fs: FsType,
        source: super::BoxedError,
    },
    /// The file system of the volume directory cannot hold a file that large (EFBIG, EINVAL).
    #[error("{op}: {source}")]
    FileTooLarge { op: String, source: std::io::Error },
    #[error(
        "the device {} of volume {volume} has {size} bytes, fewer than the required {required}: \
         the volume was not grown by ControllerExpandVolume yet, or the device does not show its \
         new size yet; retry after the controller expansion", .device.display()
    )]
    DeviceNotGrown {
        volume: String,
        device: PathBuf,
        size: u64,
        required: u64,
    },
    #[error(
        "the device {} of volume {volume} has {size} bytes, more than limit_bytes {limit}",
        .device.display()
    )]
    DeviceOverLimit {
        volume: String,
        device: PathBuf,
        size: u64,
        limit: u64,
    },
}
