//! The gRPC floor (`--grpc-floor`): the floor's host work served over CSI by a bare tonic server
//! in a process of its own, called by the same client code, at the same concurrency, with the same
//! Probe load as the agent. The bare floor has no protocol at all; every CSI plugin pays for one.
//! So the agent's figures against this floor are what its own logic costs (checks, journal,
//! hand-offs), and this floor's against the bare one are what an out-of-process round trip costs
//! on this machine: the client, the socket, HTTP/2, the server's runtime and its waits for a CPU.

mod server;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

pub use server::{ServeArgs, serve};

use super::cycle::{BenchVolume, Csi};
use super::floor;
use super::round::{self, Measured, Plan};

/// A running server, started once for every round (so that it is as warm as the agent). Dropping
/// it kills and reaps the process and removes its socket and devices file, whatever happened.
pub struct GrpcFloor {
    child: Option<Child>,
    files: [PathBuf; 2],
    endpoint: String,
    csi: Option<Csi>,
}

impl Drop for GrpcFloor {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        for f in &self.files {
            let _ = std::fs::remove_file(f);
        }
    }
}

impl GrpcFloor {
    /// Starts the server in `dir` for `plan.volumes` (each with the device its warm-up staged)
    /// and connects to it.
    pub async fn start(plan: &Plan<'_>, dir: &Path) -> Result<GrpcFloor, String> {
        let me = std::process::id();
        let devices = dir.join(format!("grpc-floor-{me}.devices"));
        let socket = dir.join(format!("grpc-floor-{me}.sock"));
        let mut floor = GrpcFloor {
            child: None,
            files: [devices.clone(), socket.clone()],
            endpoint: format!("unix://{}", socket.display()),
            csi: None,
        };
        // A socket left by a killed run would pass for the new server's before it binds.
        let _ = std::fs::remove_file(&socket);
        let mut map = String::new();
        for v in plan.volumes {
            let dev = v.device.as_ref().ok_or("a volume's device was not seen")?;
            map.push_str(&format!("{}\t{}\n", v.id, dev.display()));
        }
        std::fs::write(&devices, map).map_err(|e| format!("writing {}: {e}", devices.display()))?;
        let exe = server_binary()?;
        let child = Command::new(exe)
            .arg("--socket")
            .arg(&socket)
            .args(["--fs-type", plan.fs_type])
            .arg("--devices")
            .arg(&devices)
            .args(plan.floor_checks.then_some("--checks"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            // Out of the terminal's process group: a Ctrl-C is the bench's to handle (the
            // calls in flight end), not the server's to die of mid-call.
            .process_group(0)
            .spawn()
            .map_err(|e| format!("starting the gRPC floor: {e}"))?;
        let child = floor.child.insert(child);
        // The socket exists between bind and listen: the first connect that succeeds says ready.
        let started = Instant::now();
        let channel = loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!("the gRPC floor exited at start: {status}"));
            }
            match crate::client::connect::channel(&floor.endpoint).await {
                Ok(ch) => break ch,
                Err(e) if started.elapsed() > Duration::from_secs(10) => {
                    return Err(format!("the gRPC floor did not answer in 10 s: {e}"));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        };
        floor.csi = Some(Csi::new(channel, plan.timeout));
        Ok(floor)
    }

    /// One measured cycle. After an error, drop the server before `undo`: a call the client gave
    /// up on may still be running in it.
    pub async fn cycle(&self, plan: &Plan<'_>) -> Result<Measured, String> {
        let (Some(csi), Some(child)) = (&self.csi, &self.child) else {
            return Err("the gRPC floor is not running".into());
        };
        round::measure(csi, &self.endpoint, Some(child.id()), plan).await
    }
}

/// The server is a binary of its own (`src/bin/ebs-bench-grpc-floor.rs`), built beside the
/// agent's by `cargo build --bins`, so that the agent's binary carries none of it.
fn server_binary() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("own executable: {e}"))?;
    let server = exe.with_file_name(SERVER);
    if !server.is_file() {
        return Err(format!(
            "--grpc-floor needs {} beside this binary (cargo build --release --bins)",
            server.display()
        ));
    }
    Ok(server)
}

const SERVER: &str = "ebs-bench-grpc-floor";

/// Best effort, after a failed cycle and with the server gone: takes down what it left mounted at
/// the volumes' paths before the agent's next round or its clean-up meets them.
pub fn undo(volumes: &[BenchVolume]) {
    for v in volumes {
        floor::undo(&v.staging, &v.target);
    }
}

/// The gRPC floor across the bench's rounds: started at its first, stopped for good after a
/// failed cycle (its mounts undone), so that a failure cannot leak into the agent's next round.
#[derive(Default)]
pub struct Rounds {
    server: Option<GrpcFloor>,
    stopped: bool,
    /// Set while a cycle runs: if the bench is interrupted then, its mounts need `undo`.
    busy: Arc<AtomicBool>,
}

impl Rounds {
    pub fn busy(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.busy)
    }

    pub async fn run(
        &mut self,
        plan: &Plan<'_>,
        dir: &Path,
        total: &mut Option<Measured>,
        notes: &mut Vec<String>,
    ) -> Result<(), String> {
        if self.stopped {
            return Ok(());
        }
        let server = match &self.server {
            Some(s) => s,
            None => self.server.insert(GrpcFloor::start(plan, dir).await?),
        };
        self.busy.store(true, Ordering::SeqCst);
        let outcome = server.cycle(plan).await;
        if outcome.as_ref().is_ok_and(|r| r.cycle.errors() == 0) {
            self.busy.store(false, Ordering::SeqCst);
            total.get_or_insert_default().merge(outcome?);
            return Ok(());
        }
        self.server = None;
        self.stopped = true;
        undo(plan.volumes);
        self.busy.store(false, Ordering::SeqCst);
        notes.push("gRPC floor stopped after a failed cycle; its mounts were undone".into());
        total.get_or_insert_default().merge(outcome?);
        Ok(())
    }
}
