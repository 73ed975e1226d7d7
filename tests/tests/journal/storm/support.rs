//! The storm's helpers: a replayable PRNG, fsynced records, and what is read back from the
//! agent's log, `status` and fsck.

use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// xorshift64*: enough to spread kills and bytes, and replayable (no crate for it).
pub(super) struct Rng(u64);

impl Rng {
    /// A generator for stream `n` of `seed` (splitmix64 of both, never the all-zero state).
    pub(super) fn new(seed: u64, n: u64) -> Rng {
        let mut z = seed ^ n.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Rng((z ^ (z >> 31)).max(1))
    }
    pub(super) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub(super) fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
    pub(super) fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(self.between(lo, hi))
    }
}

pub(super) fn seed() -> u64 {
    match std::env::var("EBS_STORM_SEED") {
        Ok(s) => s.trim().parse().expect("EBS_STORM_SEED is a u64"),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64,
    }
}

/// A record with its own name and bytes, durable before the test counts on it: the file and the
/// directory entry are both fsynced (a killed agent loses no page cache, but a lost record must
/// mean a lost write, never a test that did not wait for one).
pub(super) fn write_record(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    let mut f = std::fs::File::create(dir.join(name))?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::File::open(dir)?.sync_all()
}

/// The agent's line for a finished mkfs of volume `id` in `log`, if any (the event itself, not a
/// refusal saying "nothing was formatted").
pub(super) fn mkfs_line(log: &[u8], id: &str) -> Option<String> {
    let text = String::from_utf8_lossy(log);
    let event = format!(" INFO formatted volume={id} ");
    text.lines()
        .find(|l| l.contains(&event))
        .map(str::to_string)
}

/// `e2fsck -fn` or `xfs_repair -n` on an unmounted device, bounded by `timeout(1)`: Ok if
/// clean, else what it said.
pub(super) fn fsck(fs: &str, device: &str) -> Result<(), String> {
    let tool: &[&str] = if fs == "xfs" {
        &["xfs_repair", "-n"]
    } else {
        &["e2fsck", "-fn"]
    };
    let out = Command::new("timeout")
        .arg("60")
        .args(tool)
        .arg(device)
        .output();
    let out = out.map_err(|e| format!("{tool:?}: {e}"))?;
    let said = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    let failed = format!("{tool:?} {device}: {}\n{said}", out.status);
    out.status.success().then_some(()).ok_or(failed)
}

/// This volume's entry in `status --json`: whether it is staged, and how many publications.
pub(super) fn status_of(status: &serde_json::Value, id: &str) -> (bool, usize, serde_json::Value) {
    let vs = status["volumes"].as_array();
    let v = vs.and_then(|vs| vs.iter().find(|v| v["volume_id"] == id).cloned());
    let v = v.unwrap_or_default();
    (
        !v["staged"].is_null(),
        v["published"].as_array().map_or(0, Vec::len),
        v,
    )
}
