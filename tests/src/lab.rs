//! The QEMU labs' shared runner: a script under tests/ run on the agent binary, its output
//! echoed and its wall time printed, so each lab test only says what it checks.

use std::process::{Command, Output};
use std::time::Instant;

/// Runs `tests/<script>` with the agent binary as its argument and `LAB_TIMEOUT` (seconds, the
/// environment's or `default_timeout_s`: a loaded 2-core machine slows software emulation several
/// times over). Prints stdout, stderr and `<label>: whole run N s`.
pub fn run(script: &str, label: &str, default_timeout_s: u64) -> Output {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(script);
    let started = Instant::now();
    let out = Command::new("bash")
        .arg(&path)
        .arg(crate::agent_bin())
        .env(
            "LAB_TIMEOUT",
            std::env::var("LAB_TIMEOUT").unwrap_or_else(|_| default_timeout_s.to_string()),
        )
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", path.display()));
    println!("{}", String::from_utf8_lossy(&out.stdout));
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    println!(
        "{label}: whole run {:.1} s",
        started.elapsed().as_secs_f64()
    );
    out
}
