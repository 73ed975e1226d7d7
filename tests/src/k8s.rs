//! A one-node Kubernetes for tests/tests/kubernetes.rs: the scripts under tests/k8s bring it up
//! on 127.0.0.1 with all of its state in one directory, and [`Cluster`]'s Drop tears it down
//! (processes by PID, shims, pods, mounts and loop devices under that directory, kubepods
//! cgroups), also when a scenario failed or panicked.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The repository root (this crate is `tests/`).
pub fn repo_root() -> PathBuf {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    repo.canonicalize().unwrap_or(repo)
}

/// The Kubernetes binaries: `$K8S_TOOLS`, or `shared/tools/k8s` beside the checkout or beside any
/// directory above it, then `target/tools/k8s` (where tests/k8s/fetch-tools.sh puts them). The
/// same order as `tests/k8s/fetch-tools.sh find`, which tests/run.sh asks.
pub fn find_tools() -> Result<PathBuf, String> {
    let has = |p: &Path| p.join("kubelet.xz").is_file() && p.join("kube-apiserver.xz").is_file();
    if let Some(p) = std::env::var_os("K8S_TOOLS") {
        let p = PathBuf::from(p);
        return if has(&p) {
            Ok(p)
        } else {
            Err(format!(
                "K8S_TOOLS={} has no kubelet.xz and kube-apiserver.xz",
                p.display()
            ))
        };
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"));
    repo_root()
        .ancestors()
        .skip(1)
        .map(|dir| dir.join("shared/tools/k8s"))
        .chain(std::iter::once(target.join("tools/k8s")))
        .find(|p| has(p))
        .ok_or_else(|| {
            "no Kubernetes binaries (kube-apiserver, kube-controller-manager, kube-scheduler, \
             kubelet, kubectl, the CSI sidecars and pause, as NAME.xz): fetch them with \
             tests/k8s/fetch-tools.sh (into target/tools/k8s), or put shared/tools/k8s beside \
             the checkout or a directory above it, or set K8S_TOOLS \
             (docs/operations/kubernetes.md, \"The test tier's binaries\")"
                .to_string()
        })
}

/// The host programs the cluster needs (tests/deps.sh installs them).
pub fn missing_host_programs() -> Vec<&'static str> {
    let on_path = |name: &str| {
        std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
            .unwrap_or(false)
    };
    let mut missing: Vec<&'static str> = [
        "etcd",
        "containerd",
        "containerd-shim-runc-v2",
        "ctr",
        "runc",
        "debootstrap",
        "openssl",
        "python3",
        "xz",
    ]
    .into_iter()
    .filter(|p| !on_path(p))
    .collect();
    if !Path::new("/usr/lib/cni/loopback").is_file() {
        missing.push("containernetworking-plugins (/usr/lib/cni/loopback)");
    }
    missing
}

pub struct Cluster {
    pub dir: PathBuf,
    tools: PathBuf,
    bin: PathBuf,
}

/// Seconds since the epoch, as a float.
pub fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

impl Cluster {
    /// A new directory for a cluster; nothing started yet (Drop cleans whatever `up` got to).
    pub fn new(tools: &Path) -> Cluster {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let dir = std::env::temp_dir().join(format!("ebs-k8s-{}-{nanos}", std::process::id()));
        let bin = repo_root().join("target/k8s/bin");
        Cluster {
            dir,
            tools: tools.to_path_buf(),
            bin,
        }
    }

    fn command(&self, program: &Path, timeout: Duration) -> Command {
        let mut c = Command::new("timeout");
        c.arg("--kill-after=5").arg(timeout.as_secs().to_string());
        c.arg(program);
        let path = std::env::var("PATH").unwrap_or_default();
        c.env("PATH", format!("{}:{path}", self.bin.display()))
            .env("K8S_TOOLS", &self.tools)
            .env("K8S_BIN", &self.bin)
            .env("KUBECONFIG", self.dir.join("kubeconfig"));
        c
    }

    /// Runs `tests/k8s/<script> [command] DIR args...`, its output passed through.
    pub fn script(
        &self,
        script: &str,
        command: Option<&str>,
        args: &[&str],
        timeout: Duration,
    ) -> Result<(), String> {
        let path = repo_root().join("tests/k8s").join(script);
        let status = self
            .command(&path, timeout)
            .args(command)
            .arg(&self.dir)
            .args(args)
            .stdin(Stdio::null())
            .status()
            .map_err(|e| format!("{script}: {e}"))?;
        if status.success() {
            Ok(())
        } else {
            Err(format!(
                "tests/k8s/{script} {command:?} {args:?} failed: {status}"
            ))
        }
    }

    /// `tests/k8s/<script> DIR args...` with extra environment variables.
    pub fn script_env(
        &self,
        script: &str,
        args: &[&str],
        env: &[(&str, &str)],
        timeout: Duration,
    ) -> Result<(), String> {
        let path = repo_root().join("tests/k8s").join(script);
        let mut cmd = self.command(&path, timeout);
        cmd.arg(&self.dir).args(args).stdin(Stdio::null());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let status = cmd.status().map_err(|e| format!("{script}: {e}"))?;
        if status.success() {
            Ok(())
        } else {
            Err(format!("tests/k8s/{script} {args:?} failed: {status}"))
        }
    }

    /// Runs `program` (kubectl on its PATH) with `input` on stdin; its stdout.
    pub fn run_with_input(
        &self,
        program: &Path,
        input: &[u8],
        timeout: Duration,
    ) -> Result<Vec<u8>, String> {
        use std::io::Write;
        let mut child = self
            .command(program, timeout)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| e.to_string())?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin.write_all(input).map_err(|e| e.to_string())?;
        }
        let out = child.wait_with_output().map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(out.stdout)
        } else {
            Err(format!(
                "{}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    /// kubectl against the cluster; its stdout, or its stderr as the error.
    pub fn kubectl(&self, args: &[&str]) -> Result<String, String> {
        let out = self
            .command(&self.bin.join("kubectl"), Duration::from_secs(150))
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("kubectl: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!(
                "kubectl {}: {}{}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr),
                String::from_utf8_lossy(&out.stdout)
            ))
        }
    }

    /// `kubectl apply -f -` of the given YAML.
    pub fn apply(&self, yaml: &str) -> Result<(), String> {
        let file = self.dir.join(format!("apply-{}.yaml", now()));
        std::fs::write(&file, yaml).map_err(|e| e.to_string())?;
        let path = file.to_string_lossy().into_owned();
        self.kubectl(&["apply", "-f", &path]).map(|_| ())
    }

    pub fn json(&self, args: &[&str]) -> Result<serde_json::Value, String> {
        let mut a = args.to_vec();
        a.extend(["-o", "json"]);
        let text = self.kubectl(&a)?;
        serde_json::from_str(&text).map_err(|e| format!("kubectl {}: {e}", args.join(" ")))
    }

    /// The agent container's log (the current agent pod).
    pub fn agent_log(&self) -> Result<String, String> {
        self.kubectl(&[
            "-n",
            "kube-system",
            "logs",
            "ds/ebs-node-agent",
            "-c",
            "ebs-node-agent",
        ])
    }

    /// What to look at when a scenario failed, on stderr.
    pub fn diagnostics(&self) {
        for args in [
            &[
                "get",
                "pods,pvc,pv,volumeattachments,csinode",
                "-A",
                "-o",
                "wide",
            ][..],
            &["get", "events", "-A", "--sort-by=.lastTimestamp"][..],
            &[
                "-n",
                "kube-system",
                "logs",
                "ds/ebs-node-agent",
                "--all-containers",
                "--tail=30",
            ][..],
        ] {
            eprintln!("--- kubectl {}", args.join(" "));
            match self.kubectl(args) {
                Ok(s) | Err(s) => eprintln!("{s}"),
            }
        }
        let log = self.dir.join("logs/kubelet.log");
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(30).collect();
        eprintln!("--- kubelet.log (last 30 lines, newest first)");
        for l in tail {
            eprintln!("{l}");
        }
    }

    /// Mounts at or below `dir`: (target, fstype, source).
    pub fn mounts_under(dir: &Path) -> Vec<(PathBuf, String, String)> {
        let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        text.lines()
            .filter_map(|l| {
                let (left, right) = l.split_once(" - ")?;
                let target = PathBuf::from(left.split(' ').nth(4)?);
                let mut r = right.split(' ');
                let fstype = r.next()?.to_string();
                let source = r.next()?.to_string();
                target.starts_with(dir).then_some((target, fstype, source))
            })
            .collect()
    }

    /// Mounts of CSI volumes under kubelet's directory: staging (globalmount) and publish.
    /// A port cluster.sh chose, from DIR/env (`NAME="port"`, as `declare -p` writes it).
    pub fn env_port(&self, name: &str) -> Result<u16, String> {
        let env = std::fs::read_to_string(self.dir.join("env")).map_err(|e| e.to_string())?;
        env.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix('='))
            .and_then(|v| v.trim().trim_matches('"').parse().ok())
            .ok_or_else(|| format!("no {name} in {}/env", self.dir.display()))
    }

    /// The processes cluster.sh started (DIR/pids: `name pid` a line).
    pub fn pids(&self) -> Vec<(String, u32)> {
        std::fs::read_to_string(self.dir.join("pids"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let (name, pid) = l.split_once(' ')?;
                Some((name.to_string(), pid.trim().parse().ok()?))
            })
            .collect()
    }

    pub fn volume_mounts(&self) -> Vec<(PathBuf, String, String)> {
        Self::mounts_under(&self.dir.join("kubelet"))
            .into_iter()
            .filter(|(t, _, _)| {
                let t = t.to_string_lossy();
                t.contains("/kubernetes.io~csi/") || t.contains("/plugins/kubernetes.io/csi/")
            })
            .collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Keep the logs of the last run (outside the cluster's directory, which goes).
        let keep = repo_root().join("target/k8s/last-run-logs");
        let _ = std::fs::remove_dir_all(&keep);
        if std::fs::create_dir_all(&keep).is_ok() {
            if let Ok(log) = self.agent_log() {
                let _ = std::fs::write(keep.join("agent.log"), log);
            }
            if let Ok(entries) = std::fs::read_dir(self.dir.join("logs")) {
                for e in entries.flatten() {
                    let _ = std::fs::copy(e.path(), keep.join(e.file_name()));
                }
            }
        }
        let started = Instant::now();
        if let Err(e) = self.script("cluster.sh", Some("down"), &[], Duration::from_secs(120)) {
            eprintln!("tearing down {}: {e}", self.dir.display());
        }
        eprintln!(
            "cluster {} torn down in {:.1} s",
            self.dir.display(),
            started.elapsed().as_secs_f64()
        );
    }
}

/// Polls `check` every 200 ms until it answers true or `timeout` passes.
pub fn wait_until(
    timeout: Duration,
    what: &str,
    mut check: impl FnMut() -> Result<bool, String>,
) -> Result<(), String> {
    let end = Instant::now() + timeout;
    let mut last = String::new();
    loop {
        match check() {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => last = e,
        }
        if Instant::now() >= end {
            return Err(format!(
                "timed out after {timeout:?} waiting for {what} {last}"
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `2026-11-25T20:45:36.551662Z` as seconds since the epoch.
pub fn parse_rfc3339(ts: &str) -> Option<f64> {
    let (date, time) = ts.trim_end_matches('Z').split_once('T')?;
    let mut d = date.split('-').map(|x| x.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let mut t = time.split(':');
    let (h, min) = (
        t.next()?.parse::<f64>().ok()?,
        t.next()?.parse::<f64>().ok()?,
    );
    let s: f64 = t.next()?.parse().ok()?;
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146097 + doe - 719468;
    Some(days as f64 * 86400.0 + h * 3600.0 + min * 60.0 + s)
}

/// Loop devices whose backing file's name, as losetup reports it, is below `dir`: those set up
/// by a process on the host (kubelet's pins of block volumes, over a device node it
/// bind-mounted under its directory, which the inode walk of `loops_backed_by` does not see).
pub fn loops_named_under(dir: &Path) -> Vec<String> {
    let out = Command::new("timeout")
        .args(["10", "losetup", "-l", "-n", "-O", "NAME,BACK-FILE"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let dir = dir.to_string_lossy();
    out.lines()
        .filter_map(|l| {
            let (name, back) = l.trim().split_once(char::is_whitespace)?;
            let back = back.trim().trim_end_matches(" (deleted)");
            (back.starts_with(&format!("{dir}/"))).then(|| name.to_string())
        })
        .collect()
}

/// Loop devices backed by a file below `dir`, matched by device and inode: a loop device set up
/// inside a container names its file by the container's path, which the host cannot resolve.
pub fn loops_backed_by(dir: &Path) -> Vec<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            match e.metadata() {
                Ok(m) if m.is_dir() => stack.push(e.path()),
                Ok(m) if m.is_file() => files.push((
                    format!("{}:{}", libc::major(m.dev()), libc::minor(m.dev())),
                    m.ino().to_string(),
                )),
                _ => {}
            }
        }
    }
    let out = Command::new("timeout")
        .args([
            "10",
            "losetup",
            "-l",
            "-n",
            "-O",
            "NAME,BACK-INO,BACK-MAJ:MIN",
        ])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    out.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (name, ino, dev) = (f.next()?, f.next()?, f.next()?);
            files
                .iter()
                .any(|(d, i)| d == dev && i == ino)
                .then(|| PathBuf::from(name))
        })
        .collect()
}
