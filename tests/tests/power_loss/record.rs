//! The recording: one QEMU guest per filesystem runs the workload over dm-log-writes
//! (tests/nvme-lab/powerloss/run.sh) and leaves its log disk under the run's scratch directory.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use ebs_tests::Scratch;

/// The filesystem under the state directory (and on the volume).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fs {
    Ext4,
    Xfs,
}

impl Fs {
    pub fn name(self) -> &'static str {
        match self {
            Fs::Ext4 => "ext4",
            Fs::Xfs => "xfs",
        }
    }

    /// The sizes of the logged disk's two regions (state filesystem, volume), as run.sh makes them.
    pub fn layout(self) -> (u64, u64) {
        let mib = match self {
            Fs::Ext4 => 64,
            // mkfs.xfs refuses filesystems under 300 MB.
            Fs::Xfs => 320,
        };
        (mib << 20, mib << 20)
    }
}

pub struct Recording {
    pub fs: Fs,
    /// The run's base directory: the guest used the same paths.
    pub scratch: Scratch,
    pub log: PathBuf,
    /// The volume's filesystem UUID and what was written through the target, as the guest saw.
    pub uuid: String,
    pub payload: String,
    pub took: Duration,
}

pub enum Recorded {
    Done(Box<Recording>),
    /// A prerequisite is missing (exit 3 of run.sh).
    Missing(String),
}

pub fn record(fs: Fs) -> Result<Recorded, String> {
    let scratch = Scratch::new(&format!("powerloss-{}", fs.name()));
    let out_dir = scratch.join("recording");
    let payload = format!("power-loss payload {} {}", fs.name(), std::process::id());
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("nvme-lab/powerloss/run.sh");
    let started = Instant::now();
    let out = Command::new("bash")
        .arg(&script)
        .arg(ebs_tests::agent_bin())
        .arg(fs.name())
        .arg(&scratch.path)
        .arg(&out_dir)
        .env("PAYLOAD", &payload)
        // A loaded 2-core machine slows software emulation several times over.
        .env(
            "LAB_TIMEOUT",
            std::env::var("LAB_TIMEOUT").unwrap_or_else(|_| "300".into()),
        )
        .output()
        .map_err(|e| format!("running {}: {e}", script.display()))?;
    let took = started.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    println!("{stdout}");
    if out.status.code() == Some(3) {
        return Ok(Recorded::Missing(stderr));
    }
    if !out.status.success() {
        return Err(format!(
            "the {} recording failed (exit {:?}):\n{stdout}\n{stderr}",
            fs.name(),
            out.status.code()
        ));
    }
    let status = stdout
        .lines()
        .find_map(|l| l.strip_prefix("LAB status "))
        .ok_or("no LAB status line")?;
    let status: serde_json::Value =
        serde_json::from_str(status).map_err(|e| format!("LAB status: {e}"))?;
    let uuid = status["volumes"][0]["filesystem"]["uuid"]
        .as_str()
        .ok_or("no filesystem UUID in the guest's final status")?
        .to_string();
    Ok(Recorded::Done(Box::new(Recording {
        fs,
        log: out_dir.join("log.img"),
        scratch,
        uuid,
        payload,
        took,
    })))
}
