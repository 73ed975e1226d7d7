//! A real Kubernetes API server for a test, without the rest of a cluster: etcd (Debian's
//! etcd-server) and kube-apiserver (shared/tools/k8s) on free loopback ports, with RBAC on, every
//! file under one temporary directory. Drop kills both by PID and removes the directory, also when
//! the test failed. No kubelet, no controllers: Node, CSINode and VolumeAttachment objects are
//! what the test writes, and nothing else changes them.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::k8s::{find_tools, repo_root};

pub struct ApiServer {
    pub dir: PathBuf,
    pub port: u16,
    pub kubeconfig: PathBuf,
    kubectl: PathBuf,
    children: Vec<Child>,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

fn on_path(name: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
        .unwrap_or(false)
}

/// `name` from shared/tools/k8s, unpacked once into target/k8s/apiserver-bin (a unique temporary
/// name, then a rename: tests running at once never see half a binary).
fn unpack(tools: &Path, name: &str) -> Result<PathBuf, String> {
    let bin = repo_root().join("target/k8s/apiserver-bin");
    std::fs::create_dir_all(&bin).map_err(|e| e.to_string())?;
    let out = bin.join(name);
    let src = tools.join(format!("{name}.xz"));
    let fresh = |o: &Path| {
        let m = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
        o.is_file() && m(o) >= m(&src)
    };
    if fresh(&out) {
        return Ok(out);
    }
    let tmp = bin.join(format!("{name}.{}.tmp", std::process::id()));
    let file = std::fs::File::create(&tmp).map_err(|e| e.to_string())?;
    let ok = Command::new("xz")
        .arg("-dc")
        .arg(&src)
        .stdout(file)
        .status()
        .map_err(|e| format!("xz: {e}"))?
        .success();
    if !ok {
        let _ = std::fs::remove_file(&tmp);
        return Err(format!("xz -dc {} failed", src.display()));
    }
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| e.to_string())?;
    std::fs::rename(&tmp, &out).map_err(|e| e.to_string())?;
    Ok(out)
}

impl ApiServer {
    /// A running API server, or `None` after a SKIPPED line (not root, or the tools are
    /// missing). Under CI=true nothing skips: a missing tool fails the test.
    pub fn start(test: &str) -> Option<ApiServer> {
        if !crate::require_root(test) {
            return None;
        }
        let missing: Vec<&str> = ["etcd", "openssl", "xz"]
            .into_iter()
            .filter(|p| !on_path(p))
            .collect();
        let tools = find_tools();
        let why = match (&tools, missing.is_empty()) {
            (Ok(_), true) => None,
            (Err(e), _) => Some(e.clone()),
            (_, false) => Some(format!("missing {missing:?} (tests/deps.sh installs them)")),
        };
        if let Some(why) = why {
            if crate::is_ci() {
                panic!("{test}: {why}; CI=true: refusing to skip");
            }
            crate::skip(test, &why);
            return None;
        }
        let tools = tools.expect("checked");
        let apiserver = unpack(&tools, "kube-apiserver").expect("kube-apiserver");
        let kubectl = unpack(&tools, "kubectl").expect("kubectl");
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let dir =
            std::env::temp_dir().join(format!("ebs-apiserver-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(dir.join("pki")).expect("mkdir");
        let port = free_port();
        let mut server = ApiServer {
            kubeconfig: dir.join("kubeconfig"),
            dir,
            port,
            kubectl,
            children: Vec::new(),
        };
        server.certs();
        let (etcd_port, peer_port) = (free_port(), free_port());
        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let d = server.dir.clone();
        server.spawn(
            "etcd",
            Command::new("etcd")
                .arg("--name=kd")
                .arg(format!("--data-dir={}", d.join("etcd").display()))
                .arg(format!("--listen-client-urls={etcd_url}"))
                .arg(format!("--advertise-client-urls={etcd_url}"))
                .arg(format!("--listen-peer-urls={peer_url}"))
                .arg(format!("--initial-advertise-peer-urls={peer_url}"))
                .arg(format!("--initial-cluster=kd={peer_url}"))
                .arg("--listen-metrics-urls="),
        );
        let p = |f: &str| d.join("pki").join(f).display().to_string();
        server.spawn(
            "kube-apiserver",
            Command::new(&apiserver)
                .arg(format!("--etcd-servers={etcd_url}"))
                .arg("--storage-backend=etcd3")
                .arg("--bind-address=127.0.0.1")
                .arg("--advertise-address=127.0.0.1")
                .arg(format!("--secure-port={port}"))
                .arg(format!("--tls-cert-file={}", p("apiserver.crt")))
                .arg(format!("--tls-private-key-file={}", p("apiserver.key")))
                .arg(format!("--client-ca-file={}", p("ca.crt")))
                .arg(format!("--service-account-issuer=https://127.0.0.1:{port}"))
                .arg(format!("--service-account-key-file={}", p("sa.pub")))
                .arg(format!(
                    "--service-account-signing-key-file={}",
                    p("sa.key")
                ))
                .arg("--service-cluster-ip-range=10.0.0.0/24")
                .arg("--authorization-mode=RBAC")
                .arg("--endpoint-reconciler-type=none")
                .arg("--enable-priority-and-fairness=false")
                .arg("--profiling=false"),
        );
        let start = Instant::now();
        while server.kubectl(&["get", "--raw", "/readyz"]).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(120),
                "the API server was not ready in 120 s: {}",
                server.log("kube-apiserver")
            );
            std::thread::sleep(Duration::from_millis(500));
        }
        Some(server)
    }

    fn spawn(&mut self, name: &str, cmd: &mut Command) {
        let log = std::fs::File::create(self.dir.join(format!("{name}.log"))).expect("log");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        self.children.push(child);
    }

    pub fn log(&self, name: &str) -> String {
        let text =
            std::fs::read_to_string(self.dir.join(format!("{name}.log"))).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(30).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    fn certs(&self) {
        let p = self.dir.join("pki");
        let run = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(&p)
                .output()
                .expect("openssl");
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        run(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "2",
            "-subj",
            "/CN=ebs-apiserver-test-ca",
        ]);
        for (name, subj) in [
            ("apiserver", "/CN=kube-apiserver"),
            ("admin", "/O=system:masters/CN=admin"),
        ] {
            run(&[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.csr"),
                "-subj",
                subj,
            ]);
        }
        std::fs::write(
            p.join("san.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
        )
        .expect("san");
        run(&[
            "x509",
            "-req",
            "-in",
            "apiserver.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "apiserver.crt",
            "-days",
            "2",
            "-extfile",
            "san.ext",
        ]);
        run(&[
            "x509",
            "-req",
            "-in",
            "admin.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "admin.crt",
            "-days",
            "2",
        ]);
        run(&["genrsa", "-out", "sa.key", "2048"]);
        run(&["rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub"]);
        let pp = |f: &str| p.join(f).display().to_string();
        std::fs::write(
            &self.kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: t\n  cluster: {{server: \"https://127.0.0.1:{}\", certificate-authority: \"{}\"}}\nusers:\n- name: admin\n  user: {{client-certificate: \"{}\", client-key: \"{}\"}}\ncontexts:\n- name: t\n  context: {{cluster: t, user: admin}}\ncurrent-context: t\n",
                self.port,
                pp("ca.crt"),
                pp("admin.crt"),
                pp("admin.key")
            ),
        )
        .expect("kubeconfig");
    }

    /// kubectl as the cluster's admin; stdout, or stderr as the error.
    pub fn kubectl(&self, args: &[&str]) -> Result<String, String> {
        self.kubectl_in(args, None)
    }

    /// kubectl with `input` on stdin (`apply -f -`).
    pub fn kubectl_in(&self, args: &[&str], input: Option<&str>) -> Result<String, String> {
        use std::io::Write;
        let mut child = Command::new("timeout")
            .arg("30")
            .arg(&self.kubectl)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| e.to_string())?;
        if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
            stdin
                .write_all(text.as_bytes())
                .map_err(|e| e.to_string())?;
        }
        let out = child.wait_with_output().map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    pub fn apply(&self, yaml: &str) {
        self.kubectl_in(&["apply", "-f", "-"], Some(yaml))
            .unwrap_or_else(|e| panic!("kubectl apply: {e}\n{yaml}"));
    }

    /// A directory as kubelet mounts a pod's service account: a fresh token of `namespace/name`
    /// and the cluster's CA.
    pub fn service_account_dir(&self, namespace: &str, name: &str) -> PathBuf {
        let token = self
            .kubectl(&["-n", namespace, "create", "token", name, "--duration=1h"])
            .unwrap_or_else(|e| panic!("create token: {e}"));
        let dir = self.dir.join(format!("sa-{namespace}-{name}"));
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(dir.join("token"), token.trim()).expect("token");
        std::fs::copy(self.dir.join("pki/ca.crt"), dir.join("ca.crt")).expect("ca");
        dir
    }

    /// The environment a pod on node `node` with that service account gets.
    pub fn pod_env(&self, sa_dir: &Path, node: &str) -> Vec<(String, String)> {
        vec![
            ("KUBERNETES_SERVICE_HOST".into(), "127.0.0.1".into()),
            ("KUBERNETES_SERVICE_PORT".into(), self.port.to_string()),
            (
                "EBS_AGENT_SERVICE_ACCOUNT_DIR".into(),
                sa_dir.display().to_string(),
            ),
            ("CSI_NODE_NAME".into(), node.into()),
        ]
    }

    /// `kubectl get` as JSON.
    pub fn get_json(&self, what: &[&str]) -> Option<serde_json::Value> {
        let mut args = vec!["get"];
        args.extend_from_slice(what);
        args.extend_from_slice(&["-o", "json"]);
        self.kubectl(&args)
            .ok()
            .and_then(|s| serde_json::from_str(&s).ok())
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        // The API server first, then etcd: by the PIDs started here, nothing else.
        for child in self.children.iter_mut().rev() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
