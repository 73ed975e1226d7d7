//! Minimal, audited FFI to libblkid's low-level probing API.
//!
//! Only the handful of functions needed to answer "what signature, if any, is
//! on this device?" are declared. We deliberately avoid bindgen/-sys crates so
//! every foreign call can be reviewed in this one file.

use ebs_node_core::probe::{ProbeOutcome, Signature};
use std::ffi::{CStr, CString, c_char, c_int};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Opaque `struct blkid_struct_probe`.
#[repr(C)]
struct BlkidProbeStruct {
    _private: [u8; 0],
}

type BlkidProbe = *mut BlkidProbeStruct;

const BLKID_SUBLKS_LABEL: c_int = 1 << 1;
const BLKID_SUBLKS_UUID: c_int = 1 << 3;
const BLKID_SUBLKS_TYPE: c_int = 1 << 5;
const BLKID_SUBLKS_USAGE: c_int = 1 << 7;

// SAFETY: signatures transcribed from <blkid/blkid.h> (util-linux 2.38);
// `blkid_probe` is an opaque pointer only ever passed back to libblkid.
#[link(name = "blkid")]
unsafe extern "C" {
    fn blkid_new_probe_from_filename(filename: *const c_char) -> BlkidProbe;
    fn blkid_free_probe(pr: BlkidProbe);
    fn blkid_probe_enable_superblocks(pr: BlkidProbe, enable: c_int) -> c_int;
    fn blkid_probe_set_superblocks_flags(pr: BlkidProbe, flags: c_int) -> c_int;
    fn blkid_probe_enable_partitions(pr: BlkidProbe, enable: c_int) -> c_int;
    fn blkid_do_safeprobe(pr: BlkidProbe) -> c_int;
    fn blkid_probe_lookup_value(
        pr: BlkidProbe,
        name: *const c_char,
        data: *mut *const c_char,
        len: *mut usize,
    ) -> c_int;
}

#[derive(Debug, thiserror::Error)]
pub enum BlkidError {
    #[error("device path {path:?} contains an interior NUL byte")]
    InvalidPath { path: PathBuf },
    #[error("libblkid could not open {path:?}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("libblkid failed to configure probe for {path:?} ({what})")]
    Setup { path: PathBuf, what: &'static str },
    #[error("libblkid probing of {path:?} failed: {source}")]
    Probe {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("libblkid returned unexpected code {code} probing {path:?}")]
    Unexpected { path: PathBuf, code: i32 },
}

/// Owns a probe handle so it is freed on every return path, including panics.
struct ProbeGuard(BlkidProbe);

impl Drop for ProbeGuard {
    fn drop(&mut self) {
        // SAFETY: self.0 was returned non-NULL by blkid_new_probe_from_filename
        // and is freed exactly once, here; no borrowed value outlives the guard.
        unsafe { blkid_free_probe(self.0) }
    }
}

impl ProbeGuard {
    /// Copies a result value out of the probe. The returned bytes are owned,
    /// so nothing borrowed from libblkid escapes the guard's lifetime.
    fn lookup(&self, name: &CStr) -> Option<String> {
        let mut data: *const c_char = std::ptr::null();
        let mut len: usize = 0;
        // SAFETY: self.0 is a live probe; name is a valid NUL-terminated
        // string; data/len point to writable locals.
        let rc = unsafe { blkid_probe_lookup_value(self.0, name.as_ptr(), &mut data, &mut len) };
        if rc != 0 || data.is_null() {
            return None;
        }
        // SAFETY: on success libblkid sets data to a buffer of `len` bytes
        // (including the trailing NUL) owned by the probe, which is alive for
        // the duration of this borrow; we copy it before returning.
        let bytes = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) };
        let bytes = bytes.split(|&b| b == 0).next().unwrap_or_default();
        Some(String::from_utf8_lossy(bytes).into_owned())
    }
}

/// Probes `device` (block device or regular file) for superblocks and
/// partition tables using libblkid's "safe" mode, which reports ambivalence
/// instead of guessing when signatures conflict.
pub fn probe(device: &Path) -> Result<ProbeOutcome, BlkidError> {
    let path = device.to_path_buf();
    let c_path = CString::new(device.as_os_str().as_bytes())
        .map_err(|_| BlkidError::InvalidPath { path: path.clone() })?;

    // SAFETY: c_path is a valid NUL-terminated string that outlives the call;
    // the returned pointer is either NULL or an owned probe.
    let raw = unsafe { blkid_new_probe_from_filename(c_path.as_ptr()) };
    if raw.is_null() {
        return Err(BlkidError::Open {
            path,
            source: std::io::Error::last_os_error(),
        });
    }
    let guard = ProbeGuard(raw);

    let setup_err = |what| BlkidError::Setup {
        path: path.clone(),
        what,
    };
    // The four calls below share one invariant: guard.0 is a live probe owned by this
    // function, and the calls only take integer arguments.
    // SAFETY: guard.0 is live (see above).
    if unsafe { blkid_probe_enable_superblocks(guard.0, 1) } != 0 {
        return Err(setup_err("enable superblocks"));
    }
    let flags = BLKID_SUBLKS_TYPE | BLKID_SUBLKS_UUID | BLKID_SUBLKS_USAGE | BLKID_SUBLKS_LABEL;
    // SAFETY: see above.
    if unsafe { blkid_probe_set_superblocks_flags(guard.0, flags) } != 0 {
        return Err(setup_err("set superblocks flags"));
    }
    // SAFETY: see above.
    if unsafe { blkid_probe_enable_partitions(guard.0, 1) } != 0 {
        return Err(setup_err("enable partitions"));
    }
    // SAFETY: see above.
    let rc = unsafe { blkid_do_safeprobe(guard.0) };
    match rc {
        0 => Ok(found(&guard)),
        1 => Ok(ProbeOutcome::Blank),
        -2 => Ok(ProbeOutcome::Ambivalent),
        -1 => Err(BlkidError::Probe {
            path,
            // libblkid sets errno on I/O failures; it may be stale otherwise,
            // which is still more useful than nothing.
            source: std::io::Error::last_os_error(),
        }),
        code => Err(BlkidError::Unexpected { path, code }),
    }
}

fn found(guard: &ProbeGuard) -> ProbeOutcome {
    if let Some(type_name) = guard.lookup(c"TYPE") {
        return ProbeOutcome::Found(Signature {
            type_name,
            uuid: guard.lookup(c"UUID"),
            usage: guard.lookup(c"USAGE"),
            label: guard.lookup(c"LABEL"),
            is_partition_table: false,
            external_journal: guard.lookup(c"EXT_JOURNAL"),
        });
    }
    if let Some(type_name) = guard.lookup(c"PTTYPE") {
        return ProbeOutcome::Found(Signature {
            type_name,
            uuid: guard.lookup(c"PTUUID"),
            usage: None,
            label: None,
            is_partition_table: true,
            external_journal: None,
        });
    }
    // safeprobe claimed a match but exposed neither key. Refusing to call this
    // blank is the conservative choice for a pre-mkfs check.
    ProbeOutcome::Ambivalent
}

#[cfg(test)]
mod tests {
    use super::super::loopdev::test_support::{Loop, TempFile, root_or_skip, sh};
    use super::*;

    fn found(path: &Path) -> Signature {
        match probe(path).unwrap() {
            ProbeOutcome::Found(sig) => sig,
            other => panic!("expected a signature on {path:?}, got {other:?}"),
        }
    }

    #[test]
    fn blank_file_is_blank() {
        let f = TempFile::sparse("blank", 8 << 20);
        assert_eq!(probe(&f.0).unwrap(), ProbeOutcome::Blank);
    }

    #[test]
    fn missing_device_reports_path() {
        let err = probe(Path::new("/nonexistent/dev/xyz")).unwrap_err();
        assert!(
            matches!(err, BlkidError::Open { ref path, .. } if path == Path::new("/nonexistent/dev/xyz"))
        );
        assert!(err.to_string().contains("/nonexistent/dev/xyz"));
        assert!(matches!(
            probe(Path::new("/tmp/a\0b")),
            Err(BlkidError::InvalidPath { .. })
        ));
    }

    #[test]
    fn ext4_on_loop_device() {
        if !root_or_skip("ext4_on_loop_device") {
            return;
        }
        let f = TempFile::sparse("ext4", 64 << 20);
        let lo = Loop::attach(&f.0);
        sh(&format!("mkfs.ext4 -q -F -L data\\ vol {}", lo.0.display()));
        let sig = found(&lo.0);
        assert_eq!(sig.type_name, "ext4");
        assert_eq!(sig.usage.as_deref(), Some("filesystem"));
        assert_eq!(sig.label.as_deref(), Some("data vol"));
        assert_eq!(sig.uuid.as_deref().map(str::len), Some(36));
        assert!(!sig.is_partition_table);
    }

    #[test]
    fn corrupted_ext4_primary_superblock_is_invisible() {
        // Why host::blank exists: without the magic, libblkid sees nothing.
        let f = TempFile::sparse("ext4bad", 64 << 20);
        sh(&format!("mkfs.ext4 -q -F {}", f.0.display()));
        sh(&format!(
            "printf '\\000\\000' | dd of={} bs=1 seek={} conv=notrunc status=none",
            f.0.display(),
            1024 + 0x38
        ));
        assert_eq!(probe(&f.0).unwrap(), ProbeOutcome::Blank);
    }

    #[test]
    fn xfs_on_loop_device() {
        if !root_or_skip("xfs_on_loop_device") {
            return;
        }
        let f = TempFile::sparse("xfs", 320 << 20);
        let lo = Loop::attach(&f.0);
        sh(&format!("mkfs.xfs -q -f -L lbl {}", lo.0.display()));
        let sig = found(&lo.0);
        assert_eq!(sig.type_name, "xfs");
        assert_eq!(sig.usage.as_deref(), Some("filesystem"));
        assert_eq!(sig.label.as_deref(), Some("lbl"));
    }

    #[test]
    fn conflicting_superblocks_are_ambivalent() {
        // An xfs superblock at 0 plus a valid ext4 superblock at 1 KiB.
        let x = TempFile::sparse("amb-xfs", 320 << 20);
        let e = TempFile::sparse("amb-ext4", 64 << 20);
        sh(&format!("mkfs.xfs -q -f {}", x.0.display()));
        sh(&format!("mkfs.ext4 -q -F {}", e.0.display()));
        sh(&format!(
            "dd if={} of={} bs=1024 skip=1 seek=1 count=1 conv=notrunc status=none",
            e.0.display(),
            x.0.display()
        ));
        assert_eq!(probe(&x.0).unwrap(), ProbeOutcome::Ambivalent);
    }

    #[test]
    fn gpt_partition_table() {
        let f = TempFile::sparse("gpt", 16 << 20);
        sh(&format!("sgdisk -o {} >/dev/null", f.0.display()));
        let sig = found(&f.0);
        assert_eq!(sig.type_name, "gpt");
        assert!(sig.is_partition_table);
        assert!(sig.uuid.is_some());
        assert_eq!(sig.usage, None);
    }

    #[test]
    fn dos_partition_table() {
        let f = TempFile::sparse("dos", 16 << 20);
        sh(&format!(
            "printf 'label: dos\\n,,L\\n' | sfdisk -q {}",
            f.0.display()
        ));
        let sig = found(&f.0);
        assert_eq!(sig.type_name, "dos");
        assert!(sig.is_partition_table);
    }

    #[test]
    fn lvm_physical_volume() {
        if !root_or_skip("lvm_physical_volume") {
            return;
        }
        let f = TempFile::sparse("lvm", 16 << 20);
        let lo = Loop::attach(&f.0);
        sh(&format!(
            "LVM_SUPPRESS_FD_WARNINGS=1 pvcreate -ff -y {} >/dev/null",
            lo.0.display()
        ));
        let sig = found(&lo.0);
        // Remove the PV label so LVM's caches forget the device before detach.
        sh(&format!(
            "LVM_SUPPRESS_FD_WARNINGS=1 pvremove -ff -y {} >/dev/null 2>&1 || true",
            lo.0.display()
        ));
        assert_eq!(sig.type_name, "LVM2_member");
        assert_eq!(sig.usage.as_deref(), Some("raid"));
    }

    #[test]
    fn luks_container() {
        let f = TempFile::sparse("luks", 32 << 20);
        let key = TempFile::sparse("luks-key", 0);
        std::fs::write(&key.0, b"not-a-secret").unwrap();
        sh(&format!(
            "cryptsetup luksFormat --batch-mode --type luks2 --pbkdf pbkdf2 \
             --pbkdf-force-iterations 1000 --key-file {} {} 2>/dev/null",
            key.0.display(),
            f.0.display()
        ));
        let sig = found(&f.0);
        assert_eq!(sig.type_name, "crypto_LUKS");
        assert_eq!(sig.usage.as_deref(), Some("crypto"));
        assert!(sig.uuid.is_some());
    }

    #[test]
    fn swap_on_plain_file() {
        let f = TempFile::sparse("swap", 16 << 20);
        sh(&format!("mkswap -L sw {} >/dev/null", f.0.display()));
        let sig = found(&f.0);
        assert_eq!(sig.type_name, "swap");
        assert_eq!(sig.usage.as_deref(), Some("other"));
        assert_eq!(sig.label.as_deref(), Some("sw"));
    }

    #[test]
    fn filesystem_wins_over_stale_partition_table() {
        // mkfs on a whole disk that once had a GPT: safeprobe must not call it
        // blank, whichever signature it prefers.
        let f = TempFile::sparse("gpt-ext4", 64 << 20);
        sh(&format!("sgdisk -o {} >/dev/null", f.0.display()));
        sh(&format!("mkfs.ext4 -q -F {}", f.0.display()));
        let outcome = probe(&f.0).unwrap();
        eprintln!("gpt then ext4: {outcome:?}");
        assert_ne!(outcome, ProbeOutcome::Blank);
    }
}
