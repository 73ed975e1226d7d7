//! Shared helpers for the integration tests: start the real `ebs-node-agent` binary on a real
//! socket, talk CSI to it, and leave the host clean even when a test fails (Drop guards unmount,
//! detach loop devices and remove temp files).

pub mod addons;
pub mod controller_cases;
pub mod csi_req;
pub mod fake_controller;
pub mod http;
pub mod hung_mount;
pub mod imds;
pub mod legacy;
pub mod log_writes;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

pub use ebs_proto::csi::v1 as csi;
use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};

/// The agent binary: `$EBS_AGENT_BIN`, or the one cargo built next to this test executable.
pub fn agent_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("EBS_AGENT_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("current_exe");
    // target/debug/deps/<test> → target/debug/ebs-node-agent
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let bin = dir.join("ebs-node-agent");
    assert!(
        bin.exists(),
        "{} is missing: build it first (cargo build --workspace --bins)",
        bin.display()
    );
    bin
}

pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Root-only tests call this first: outside root they skip, but under CI=true they must run.
pub fn require_root(test: &str) -> bool {
    if is_root() {
        return true;
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{test} needs root and CI=true: refusing to skip");
    }
    eprintln!("skipping {test}: needs root");
    false
}

/// A scratch directory that, when dropped, unmounts everything below it, detaches loop devices
/// backed by files below it, and removes it.
pub struct Scratch {
    pub path: PathBuf,
}

impl Scratch {
    pub fn new(name: &str) -> Self {
        let path = std::env::temp_dir().join(format!("ebs-it-{name}-{}", std::process::id()));
        cleanup_dir(&path);
        std::fs::create_dir_all(&path).expect("create scratch");
        Scratch { path }
    }

    pub fn join(&self, p: &str) -> PathBuf {
        self.path.join(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        cleanup_dir(&self.path);
    }
}

fn decode_mountinfo_path(raw: &str) -> PathBuf {
    let mut out = Vec::new();
    let b = raw.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && let Ok(v) = u8::from_str_radix(&raw[i + 1..i + 4], 8)
        {
            out.push(v);
            i += 4;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    PathBuf::from(std::ffi::OsString::from(
        String::from_utf8_lossy(&out).into_owned(),
    ))
}

/// Mount points at or below `dir`, deepest (latest) first.
pub fn mounts_below(dir: &Path) -> Vec<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut out: Vec<PathBuf> = text
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(decode_mountinfo_path)
        .filter(|p| p.starts_with(dir))
        .collect();
    out.reverse();
    out
}

/// Loop devices whose backing file lies below `dir`.
pub fn loops_below(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/sys/block") {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !name.starts_with("loop") {
                continue;
            }
            if let Ok(b) = std::fs::read_to_string(e.path().join("loop/backing_file"))
                && Path::new(b.trim().trim_end_matches(" (deleted)")).starts_with(dir)
            {
                out.push(PathBuf::from("/dev").join(&name));
            }
        }
    }
    out
}

pub fn cleanup_dir(dir: &Path) {
    // Loops first: once a filesystem below `dir` is lazily unmounted, a loop file on it shows a
    // path relative to that detached mount, and would keep it (and its own loop) alive. Each
    // device is checked again right before it is detached: one the agent already freed may have
    // been taken by another test in the meantime, and must not be pulled from under it.
    detach_loops_below(dir);
    for m in mounts_below(dir) {
        let _ = nix::mount::umount2(&m, nix::mount::MntFlags::MNT_DETACH);
    }
    detach_loops_below(dir);
    let _ = std::fs::remove_dir_all(dir);
}

fn detach_loops_below(dir: &Path) {
    for dev in loops_below(dir) {
        let name = dev
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let still_ours = std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file"))
            .is_ok_and(|b| Path::new(b.trim().trim_end_matches(" (deleted)")).starts_with(dir));
        if still_ours {
            // Mounted devices only get autoclear here and go when their last user does.
            let _ = Command::new("losetup")
                .arg("-d")
                .arg(&dev)
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// How to start an agent.
#[derive(Clone)]
pub struct AgentOpts {
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub wait_ready: bool,
}

impl Default for AgentOpts {
    fn default() -> Self {
        AgentOpts {
            args: vec!["--backend".into(), "loop".into()],
            env: Vec::new(),
            wait_ready: true,
        }
    }
}

/// A running agent process, killed on drop.
pub struct Agent {
    pub child: Option<Child>,
    pub socket: PathBuf,
    pub state_dir: PathBuf,
    /// Where tests put staging and target paths: an allowed path prefix of its own, apart from
    /// the state directory (which holds the agent's files and is no place for mounts).
    pub work: PathBuf,
    pub log: PathBuf,
    pub opts: AgentOpts,
}

impl Agent {
    /// Starts an agent whose socket and state live under `scratch`.
    pub async fn start(scratch: &Scratch, opts: AgentOpts) -> Agent {
        let mut agent = Agent {
            child: None,
            socket: scratch.join("run/csi.sock"),
            state_dir: scratch.join("state"),
            work: scratch.join("w"),
            log: scratch.join("agent.log"),
            opts,
        };
        agent.spawn().await;
        agent
    }

    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    /// `serve` with this agent's endpoint, state directory and options.
    pub fn serve_args(&self) -> Vec<std::ffi::OsString> {
        let mut args: Vec<std::ffi::OsString> = vec![
            "serve".into(),
            "--endpoint".into(),
            self.endpoint().into(),
            "--state-dir".into(),
            self.state_dir.clone().into(),
        ];
        // The work dir is the allowed prefix unless the test chose its own prefixes.
        let chosen = self
            .opts
            .args
            .iter()
            .any(|a| a.starts_with("--allowed-path-prefix"))
            || self
                .opts
                .env
                .iter()
                .any(|(k, _)| k == "EBS_AGENT_ALLOWED_PATH_PREFIXES");
        if !chosen {
            let _ = std::fs::create_dir_all(&self.work);
            args.push("--allowed-path-prefix".into());
            args.push(self.work.clone().into());
        }
        args.extend(self.opts.args.iter().map(Into::into));
        args
    }

    pub async fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("log file");
        let mut cmd = Command::new(agent_bin());
        cmd.args(self.serve_args())
            .envs(self.opts.env.iter().map(|(k, v)| (k, v)))
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log);
        self.child = Some(cmd.spawn().expect("spawn agent"));
        if self.opts.wait_ready {
            self.wait_ready().await;
        }
    }

    pub async fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!("agent exited early ({status}); log:\n{}", self.log_text());
            }
            if let Ok(ch) = channel(&self.socket).await {
                let mut id = csi::identity_client::IdentityClient::new(ch);
                if let Ok(r) = id.probe(csi::ProbeRequest {}).await
                    && r.into_inner().ready != Some(false)
                {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "agent not ready in time; log:\n{}",
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// SIGKILL, as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Waits for the agent to exit by itself (fault injection kills it).
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(st)) = c.try_wait()
            {
                self.child = None;
                return Some(st);
            }
            // Yield to the runtime: our own client connections must be able to close.
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        None
    }

    /// SIGTERM and wait for a clean exit.
    pub async fn terminate(&mut self) -> Option<ExitStatus> {
        let pid = self.pid();
        if pid == 0 {
            return None;
        }
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        self.wait_exit(Duration::from_secs(20)).await
    }

    /// Restarts on the same state dir, with other options if given.
    pub async fn restart(&mut self, opts: Option<AgentOpts>) {
        self.kill();
        if let Some(o) = opts {
            self.opts = o;
        }
        self.spawn().await;
    }

    pub async fn channel(&self) -> Channel {
        channel(&self.socket).await.expect("connect")
    }

    pub async fn identity(&self) -> csi::identity_client::IdentityClient<Channel> {
        csi::identity_client::IdentityClient::new(self.channel().await)
    }

    pub async fn node(&self) -> csi::node_client::NodeClient<Channel> {
        csi::node_client::NodeClient::new(self.channel().await)
    }

    pub async fn controller(&self) -> csi::controller_client::ControllerClient<Channel> {
        csi::controller_client::ControllerClient::new(self.channel().await)
    }

    /// ControllerExpandVolume to `bytes`, with the capability if one is given.
    pub async fn expand_on_controller(
        &self,
        volume_id: &str,
        bytes: i64,
        capability: Option<csi::VolumeCapability>,
    ) -> Result<csi::ControllerExpandVolumeResponse, tonic::Status> {
        self.controller()
            .await
            .controller_expand_volume(csi::ControllerExpandVolumeRequest {
                volume_id: volume_id.to_string(),
                capacity_range: csi_req::at_least(bytes),
                volume_capability: capability,
                ..Default::default()
            })
            .await
            .map(tonic::Response::into_inner)
    }

    /// `status --json` for this agent's state directory (read from the file when it is stopped).
    pub fn status_json(&self) -> serde_json::Value {
        let out = Command::new(agent_bin())
            .args([
                "status",
                "--json",
                "--endpoint",
                &self.endpoint(),
                "--state-dir",
            ])
            .arg(&self.state_dir)
            .output()
            .expect("status");
        serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null)
    }

    /// Runs `ebs-node-agent client --endpoint <ours> --json <args>` and parses its JSON.
    pub fn client_json(&self, args: &[&str]) -> (bool, serde_json::Value) {
        let out = Command::new(agent_bin())
            .arg("client")
            .arg("--endpoint")
            .arg(self.endpoint())
            .arg("--json")
            .args(args)
            .output()
            .expect("client");
        let v = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
        (out.status.success(), v)
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill();
    }
}

pub async fn channel(socket: &Path) -> Result<Channel, tonic::transport::Error> {
    let path = socket.to_path_buf();
    Endpoint::try_from("http://localhost")?
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                let s = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(TokioIo::new(s))
            }
        }))
        .await
}

/// Makes a directory unwritable even for root is impossible; instead this makes a path whose
/// parent is a regular file, which no one can create a directory under.
pub fn unwritable_dir(scratch: &Scratch) -> PathBuf {
    let f = scratch.join("not-a-dir");
    std::fs::write(&f, b"x").expect("write");
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o444)).expect("chmod");
    f.join("state")
}

/// sha256-free checksum of a whole device or file, good enough to see that bytes changed.
pub fn checksum(path: &Path) -> u64 {
    use std::hash::Hasher;
    use std::io::Read;
    let mut f = std::fs::File::open(path).expect("open for checksum");
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).expect("read");
        if n == 0 {
            break;
        }
        h.write(&buf[..n]);
    }
    h.finish()
}

pub fn sh(script: &str) -> std::process::Output {
    let out = Command::new("sh")
        .arg("-c")
        .arg(script)
        .output()
        .expect("sh");
    assert!(
        out.status.success(),
        "`{script}` failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}
