//! A running `ebs-node-agent` for a test: started on a scratch socket, state directory and work
//! directory, reached over its real socket, killed on drop.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::{Scratch, agent_bin, csi, csi_req};

/// How to start an agent.
#[derive(Clone)]
pub struct AgentOpts {
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub wait_ready: bool,
}

impl AgentOpts {
    /// The loop backend with its Prometheus endpoint on `address`.
    pub fn with_metrics(address: impl Into<String>) -> AgentOpts {
        AgentOpts {
            args: vec![
                "--backend".into(),
                "loop".into(),
                "--metrics-address".into(),
                address.into(),
            ],
            ..Default::default()
        }
    }
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
    /// A command the agent is started through (it execs the agent with its arguments appended),
    /// kept across restarts: e.g. one that installs a seccomp filter first.
    pub wrapper: Vec<std::ffi::OsString>,
}

impl Agent {
    /// Starts an agent whose socket and state live under `scratch`.
    pub async fn start(scratch: &Scratch, opts: AgentOpts) -> Agent {
        let mut agent = Agent::unstarted(scratch, opts);
        agent.spawn().await;
        agent
    }

    /// The paths of an agent under `scratch`, for a test that starts the process its own way.
    pub fn unstarted(scratch: &Scratch, opts: AgentOpts) -> Agent {
        Agent {
            child: None,
            socket: scratch.join("run/csi.sock"),
            state_dir: scratch.join("state"),
            work: scratch.join("w"),
            log: scratch.join("agent.log"),
            opts,
            wrapper: Vec::new(),
        }
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

    /// `recover <how> --state-dir <its state>` (the agent stopped), which must succeed; what it
    /// printed.
    pub fn recover(&self, how: &str) -> String {
        let out = Command::new(agent_bin())
            .args(["recover", how, "--state-dir"])
            .arg(&self.state_dir)
            .output()
            .expect("recover");
        assert!(
            out.status.success(),
            "recover {how}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub async fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("log file");
        let mut cmd = match self.wrapper.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(agent_bin());
                c
            }
            None => Command::new(agent_bin()),
        };
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
        if let Err(why) = self.try_wait_ready(Duration::from_secs(20)).await {
            panic!("{why}");
        }
    }

    /// Waits until Probe says ready, for `within` at most; otherwise why not, with the log.
    pub async fn try_wait_ready(&mut self, within: Duration) -> Result<(), String> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                return Err(format!(
                    "agent exited early ({status}); log:\n{}",
                    self.log_text()
                ));
            }
            if let Ok(ch) = channel(&self.socket).await {
                let mut id = csi::identity_client::IdentityClient::new(ch);
                if let Ok(r) = id.probe(csi::ProbeRequest {}).await
                    && r.into_inner().ready != Some(false)
                {
                    return Ok(());
                }
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "agent not ready in {} s; log:\n{}",
                    within.as_secs(),
                    self.log_text()
                ));
            }
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
