//! Outside programs some tests run (csi-sanity, the Kubernetes tier's binaries), found by
//! `tests/tools.sh find`, the one lookup that `tests/run.sh` (which may also build them) uses:
//! an environment variable per tool (`CSI_SANITY`, `KUBELET`, ...), then `shared/tools/` beside
//! the checkout or above it (`.xz` unpacked into `target/tools/`), then `target/tools/`.

use std::path::PathBuf;
use std::process::{Command, Stdio};

/// The path of tool `name` (`csi-sanity`, `k8s/kubelet`), or what to do to provide it.
pub fn tool(name: &str) -> Result<PathBuf, String> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tools.sh");
    let out = Command::new("bash")
        .args([script, "find", name])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running {script}: {e}"))?;
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if out.status.success() && !path.is_empty() {
        return Ok(PathBuf::from(path));
    }
    Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
}
