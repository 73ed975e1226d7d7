//! The shipped deployment files, checked against the agent itself: every manifest, job and unit
//! is parsed, and the settings it gives the agent are handed to `serve --print-config`, so the
//! socket paths, mode, directories and prefixes an orchestrator uses are compared with what the
//! agent would really run with. One source of truth: the agent's own flag parsing.

use std::path::{Path, PathBuf};
use std::process::Command;

use ebs_tests::*;
use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// What the agent would run with, given these `serve` arguments and only this environment.
fn print_config(args: &[String], env: &[(String, String)]) -> Value {
    let out = Command::new(agent_bin())
        .arg("serve")
        .args(args)
        .arg("--print-config")
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .expect("run agent");
    assert!(
        out.status.success(),
        "serve {args:?} with {env:?} rejected: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("print-config JSON")
}

fn str_of<'a>(v: &'a Value, what: &str) -> &'a str {
    v.as_str()
        .unwrap_or_else(|| panic!("{what} is not a string: {v}"))
}

fn allowed(cfg: &Value, path: &str) -> bool {
    cfg["allowed_path_prefixes"]
        .as_array()
        .expect("prefixes")
        .iter()
        .any(|p| Path::new(path).starts_with(str_of(p, "prefix")))
}

fn is_loopback(addr: &str) -> bool {
    addr.parse::<std::net::SocketAddr>()
        .expect("socket address")
        .ip()
        .is_loopback()
}

fn shipped_files(ext: &[&str]) -> Vec<PathBuf> {
    fn walk(dir: &Path, ext: &[&str], out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).expect("read_dir").flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, ext, out);
            } else if p.extension().is_some_and(|x| ext.iter().any(|w| x == *w)) {
                out.push(p);
            }
        }
    }
    let mut out = Vec::new();
    walk(&repo().join("packaging"), ext, &mut out);
    out.sort();
    out
}

// ---- YAML -------------------------------------------------------------------------------------

fn yaml_to_json(y: &yaml_rust2::Yaml) -> Value {
    use yaml_rust2::Yaml;
    match y {
        Yaml::Real(r) => r.parse::<f64>().map(Value::from).unwrap_or(Value::Null),
        Yaml::Integer(i) => Value::from(*i),
        Yaml::String(s) => Value::from(s.clone()),
        Yaml::Boolean(b) => Value::from(*b),
        Yaml::Array(a) => Value::Array(a.iter().map(yaml_to_json).collect()),
        Yaml::Hash(h) => Value::Object(
            h.iter()
                .map(|(k, v)| (k.as_str().expect("string key").to_string(), yaml_to_json(v)))
                .collect(),
        ),
        _ => Value::Null,
    }
}

fn yaml_docs(rel: &str) -> Vec<Value> {
    let docs = yaml_rust2::YamlLoader::load_from_str(&read(rel))
        .unwrap_or_else(|e| panic!("{rel} is not YAML: {e}"));
    docs.iter().map(yaml_to_json).collect()
}

fn find<'a>(items: &'a Value, name: &str) -> &'a Value {
    items
        .as_array()
        .and_then(|a| a.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no item named {name} in {items}"))
}

fn flag<'a>(args: &'a Value, name: &str) -> &'a str {
    let prefix = format!("--{name}=");
    args.as_array()
        .and_then(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .find_map(|s| s.strip_prefix(&prefix))
        })
        .unwrap_or_else(|| panic!("no {prefix} in {args}"))
}

#[test]
fn every_shipped_yaml_and_json_file_parses() {
    let yaml = shipped_files(&["yaml", "yml"]);
    assert!(yaml.len() >= 3, "{yaml:?}");
    for f in yaml {
        let rel = f
            .strip_prefix(repo())
            .expect("in repo")
            .to_string_lossy()
            .into_owned();
        let docs = yaml_docs(&rel);
        assert!(!docs.is_empty(), "{rel} is empty");
        for d in docs {
            assert!(
                d["apiVersion"].is_string() && d["kind"].is_string(),
                "{rel}: {d}"
            );
        }
    }
    let json = shipped_files(&["json"]);
    assert!(json.len() >= 2, "{json:?}");
    for f in json {
        let text = std::fs::read_to_string(&f).expect("read");
        serde_json::from_str::<Value>(&text).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
    }
}

#[test]
fn daemonset_gives_the_agent_and_sidecars_one_socket_and_the_mounts_it_needs() {
    let ds = yaml_docs("packaging/kubernetes/daemonset.yaml").remove(0);
    let driver = yaml_docs("packaging/kubernetes/csidriver.yaml").remove(0);
    let pod = &ds["spec"]["template"]["spec"];
    let containers = &pod["containers"];
    let agent = find(containers, "ebs-node-agent");

    let args: Vec<String> = agent["args"].as_array().expect("args")[1..]
        .iter()
        .map(|a| str_of(a, "arg").to_string())
        .collect();
    assert_eq!(agent["args"][0], "serve");
    let env: Vec<(String, String)> = agent["env"]
        .as_array()
        .expect("env")
        .iter()
        .map(|e| {
            (
                str_of(&e["name"], "name").into(),
                str_of(&e["value"], "value").into(),
            )
        })
        .collect();
    let cfg = print_config(&args, &env);

    // Node only, no credentials, no API token.
    assert_eq!(cfg["mode"], "node");
    assert_eq!(cfg["serves_controller"], false);
    assert_eq!(pod["automountServiceAccountToken"], false);
    assert!(pod["serviceAccountName"].is_null());
    assert!(env.iter().all(|(k, _)| !k.starts_with("AWS_")), "{env:?}");
    assert!(
        pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|v| v["secret"].is_null())
    );
    assert_eq!(agent["securityContext"]["privileged"], true);
    assert_eq!(driver["metadata"]["name"], cfg["driver_name"]);
    assert_eq!(driver["spec"]["attachRequired"], true);

    // The socket: the agent's endpoint, the sidecars' --csi-address, kubelet's registration path.
    let socket = str_of(&cfg["socket_path"], "socket_path");
    let socket_dir = Path::new(socket).parent().unwrap().to_str().unwrap();
    let socket_name = Path::new(socket).file_name().unwrap().to_str().unwrap();
    let mount_of = |c: &Value, path: &str| -> Value {
        c["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["mountPath"] == path)
            .cloned()
            .unwrap_or_else(|| panic!("{} does not mount {path}", c["name"]))
    };
    let plugin_volume = mount_of(agent, socket_dir)["name"].clone();
    for name in ["node-driver-registrar", "liveness-probe"] {
        let c = find(containers, name);
        assert_eq!(flag(&c["args"], "csi-address"), socket, "{name}");
        assert_eq!(mount_of(c, socket_dir)["name"], plugin_volume, "{name}");
    }
    let plugin_host = find(&pod["volumes"], str_of(&plugin_volume, "volume"))["hostPath"]["path"]
        .as_str()
        .unwrap()
        .trim_end_matches('/')
        .to_string();
    let registrar = find(containers, "node-driver-registrar");
    assert_eq!(
        flag(&registrar["args"], "kubelet-registration-path"),
        format!("{plugin_host}/{socket_name}")
    );
    assert!(
        plugin_host.ends_with(str_of(&cfg["driver_name"], "driver")),
        "{plugin_host}"
    );

    // kubelet's paths: same path inside and out, Bidirectional, and allowed by the agent.
    let kubelet = mount_of(agent, "/var/lib/kubelet");
    assert_eq!(kubelet["mountPropagation"], "Bidirectional");
    let kubelet_volume = find(&pod["volumes"], str_of(&kubelet["name"], "name"));
    assert_eq!(kubelet_volume["hostPath"]["path"], "/var/lib/kubelet");
    assert!(allowed(
        &cfg,
        "/var/lib/kubelet/pods/uid/volumes/kubernetes.io~csi/pv/mount"
    ));
    assert!(allowed(
        &cfg,
        "/var/lib/kubelet/plugins/kubernetes.io/csi/ebs.csi.aws.com/x/globalmount"
    ));

    // Host /dev (volumes attached later appear there) and the state dir on the host.
    let dev = mount_of(agent, "/dev");
    assert_eq!(
        find(&pod["volumes"], str_of(&dev["name"], "dev"))["hostPath"]["path"],
        "/dev"
    );
    let state_dir = str_of(&cfg["state_dir"], "state_dir");
    let state = mount_of(agent, state_dir);
    assert!(find(&pod["volumes"], str_of(&state["name"], "state"))["hostPath"].is_object());

    // Liveness: the port kubelet probes is the one the livenessprobe sidecar serves.
    let probe = find(containers, "liveness-probe");
    let port = find(&agent["ports"], "healthz")["containerPort"]
        .as_i64()
        .unwrap();
    assert_eq!(flag(&probe["args"], "health-port"), port.to_string());
    assert_eq!(agent["livenessProbe"]["httpGet"]["port"], "healthz");

    // Shutdown: the pod's grace outlasts the agent's drain; metrics stay on loopback.
    let grace_s = cfg["shutdown_grace_ms"].as_u64().unwrap() / 1000;
    assert!(pod["terminationGracePeriodSeconds"].as_u64().unwrap() > grace_s);
    assert!(is_loopback(str_of(&cfg["metrics_address"], "metrics")));
}

// ---- Nomad (HCL, read at the level these checks need) -----------------------------------------

/// The `key = value` lines directly inside the first `name { ... }` block.
fn hcl_block(text: &str, name: &str) -> Vec<(String, String)> {
    let start = text
        .lines()
        .position(|l| l.trim() == format!("{name} {{"))
        .unwrap_or_else(|| panic!("no {name} block"));
    let mut depth = 0;
    let mut out = Vec::new();
    for line in text.lines().skip(start) {
        let l = line.split('#').next().unwrap_or("").trim();
        if l.ends_with('{') {
            depth += 1;
            continue;
        }
        if l == "}" {
            depth -= 1;
            if depth == 0 {
                break;
            }
            continue;
        }
        if depth == 1
            && let Some((k, v)) = l.split_once('=')
        {
            out.push((k.trim().to_string(), v.trim().trim_matches('"').to_string()));
        }
    }
    out
}

fn get<'a>(block: &'a [(String, String)], key: &str) -> &'a str {
    block
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("no {key} in {block:?}"))
}

fn seconds(raw: &str) -> u64 {
    let (n, unit) = raw.split_at(raw.find(|c: char| !c.is_ascii_digit()).unwrap_or(raw.len()));
    let n: u64 = n.parse().expect("number");
    match unit {
        "s" | "" => n,
        "m" => n * 60,
        other => panic!("unit {other}"),
    }
}

fn check_nomad_job(rel: &str) -> (Value, Vec<(String, String)>) {
    let text = read(rel);
    let env = hcl_block(&text, "env");
    let plugin = hcl_block(&text, "csi_plugin");
    assert!(text.contains("args       = [\"serve\"]") || text.contains("args  = [\"serve\"]"));
    let cfg = print_config(&[], &env);
    // Nomad looks for `csi.sock` in mount_dir.
    assert_eq!(
        Path::new(str_of(&cfg["socket_path"], "socket")),
        Path::new(get(&plugin, "mount_dir")).join("csi.sock"),
        "{rel}"
    );
    assert_eq!(get(&plugin, "id"), cfg["driver_name"], "{rel}");
    let (node, controller) = match get(&plugin, "type") {
        "node" => (true, false),
        "controller" => (false, true),
        "monolith" => (true, true),
        other => panic!("{rel}: type {other}"),
    };
    assert_eq!(cfg["serves_node"], node, "{rel}");
    assert_eq!(cfg["serves_controller"], controller, "{rel}");
    assert!(seconds(get(&plugin, "health_timeout")) >= 30, "{rel}");
    (cfg, plugin)
}

#[test]
fn nomad_jobs_match_the_agent_flags() {
    let rel = "packaging/nomad/ebs-node.nomad.hcl";
    let (cfg, plugin) = check_nomad_job(rel);
    let text = read(rel);
    let stage_base = get(&plugin, "stage_publish_base_dir");
    assert!(allowed(
        &cfg,
        &format!("{stage_base}/staging/vol/rw-file-system-single-node-writer")
    ));
    assert!(allowed(
        &cfg,
        &format!("{stage_base}/per-alloc/alloc/vol/rw-file-system")
    ));
    assert!(text.contains("privileged = true"));
    let docker = hcl_block(&text, "config");
    assert_eq!(get(&docker, "privileged"), "true");
    // The host /dev and the state dir are bind-mounted.
    let mounts: Vec<&str> = text.split("mount {").skip(1).collect();
    let binds = |target: &str| {
        mounts
            .iter()
            .any(|m| m.contains(&format!("target = \"{target}\"")))
    };
    assert!(binds("/dev"), "{rel}: no /dev bind mount");
    assert!(
        binds(str_of(&cfg["state_dir"], "state_dir")),
        "{rel}: no state dir mount"
    );
    let kill = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("kill_timeout = "))
        .expect("kill_timeout");
    assert!(seconds(kill.trim_matches('"')) * 1000 > cfg["shutdown_grace_ms"].as_u64().unwrap());

    let (ctrl, _) = check_nomad_job("packaging/nomad/ebs-controller.nomad.hcl");
    assert_eq!(ctrl["mode"], "controller");

    let volume = read("packaging/nomad/volume.hcl");
    assert!(volume.contains(&format!("plugin_id   = {}", cfg["driver_name"])));
}

// ---- systemd, Mesos, container ----------------------------------------------------------------

fn unit_values(key: &str) -> Vec<String> {
    read("systemd/ebs-node-agent.service")
        .lines()
        .filter_map(|l| l.strip_prefix(&format!("{key}=")))
        .map(str::to_string)
        .collect()
}

fn unit_value(key: &str) -> String {
    let v = unit_values(key);
    assert_eq!(v.len(), 1, "{key}: {v:?}");
    v[0].clone()
}

fn env_file() -> Vec<(String, String)> {
    read("systemd/ebs-node-agent.env")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (k, v) = l.split_once('=').expect("KEY=value");
            (k.to_string(), v.to_string())
        })
        .collect()
}

/// The agent as the unit starts it: the env file, then ExecStart's arguments.
fn systemd_config() -> Value {
    let exec = unit_value("ExecStart");
    let mut words = exec.split_whitespace();
    assert_eq!(words.next(), Some("/usr/local/bin/ebs-node-agent"));
    assert_eq!(words.next(), Some("serve"));
    let args: Vec<String> = words.map(str::to_string).collect();
    print_config(&args, &env_file())
}

#[test]
fn systemd_unit_verifies() {
    let dir = Scratch::new("unit-verify");
    let unit = read("systemd/ebs-node-agent.service").replace(
        "/usr/local/bin/ebs-node-agent",
        &agent_bin().display().to_string(),
    );
    let path = dir.join("ebs-node-agent.service");
    std::fs::write(&path, unit).expect("write unit");
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .expect("systemd-analyze (apt-get install systemd)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "verify failed: {stderr}");
    // Unknown keys and unparsable values are only warnings: they count as failures here.
    let ours: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("ebs-node-agent"))
        .collect();
    assert!(ours.is_empty(), "{ours:#?}");
}

#[test]
fn systemd_unit_and_env_file_match_the_agent_flags() {
    let cfg = systemd_config();
    assert_eq!(unit_value("Type"), "notify");
    assert_eq!(unit_value("NotifyAccess"), "main");
    assert!(!unit_value("WatchdogSec").is_empty());
    // Socket under the RuntimeDirectory, state in the StateDirectory.
    let runtime = Path::new("/run").join(unit_value("RuntimeDirectory"));
    assert!(Path::new(str_of(&cfg["socket_path"], "socket")).starts_with(&runtime));
    assert_eq!(
        Path::new(str_of(&cfg["state_dir"], "state")),
        Path::new("/var/lib").join(unit_value("StateDirectory"))
    );
    // systemd waits longer than the agent drains.
    let stop = seconds(&unit_value("TimeoutStopSec"));
    assert!(stop * 1000 > cfg["shutdown_grace_ms"].as_u64().unwrap());
    // Metrics on loopback, which IPAddressAllow lets through.
    assert!(is_loopback(str_of(&cfg["metrics_address"], "metrics")));
    assert!(
        unit_value("IPAddressAllow")
            .split(' ')
            .any(|a| a == "localhost")
    );
    // No option that would give the unit its own mount namespace.
    for key in [
        "ProtectSystem",
        "ProtectHome",
        "PrivateTmp",
        "PrivateDevices",
        "PrivateMounts",
        "ProtectKernelTunables",
        "ProtectKernelModules",
        "ProtectKernelLogs",
        "ProtectControlGroups",
        "ProtectProc",
        "ReadOnlyPaths",
        "ReadWritePaths",
        "InaccessiblePaths",
        "TemporaryFileSystem",
        "BindPaths",
        "ProtectClock",
        "PrivateUsers",
        "MountFlags",
        "RootDirectory",
    ] {
        assert!(
            unit_values(key).is_empty(),
            "{key} would hide the agent's mounts"
        );
    }
    // Every hardening line says why: a comment right above it.
    let text = read("systemd/ebs-node-agent.service");
    let lines: Vec<&str> = text.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.contains("Hardening"))
        .expect("hardening");
    for (i, l) in lines.iter().enumerate().skip(start) {
        if l.contains('=')
            && !l.starts_with('#')
            && !l.starts_with('[')
            && !l.starts_with("WantedBy")
        {
            let above = lines[..i]
                .iter()
                .rev()
                .take_while(|a| !a.is_empty())
                .collect::<Vec<_>>();
            assert!(
                above.iter().any(|a| a.starts_with('#')),
                "no reason given for {l}"
            );
        }
    }
}

#[test]
fn mesos_configs_match_the_agent_flags() {
    let unmanaged: Value =
        serde_json::from_str(&read("packaging/mesos/ebs-unmanaged.json")).unwrap();
    let cfg = systemd_config();
    assert_eq!(unmanaged["type"], cfg["driver_name"]);
    let endpoint = &unmanaged["endpoints"][0];
    assert_eq!(endpoint["csi_service"], "NODE_SERVICE");
    assert_eq!(
        endpoint["endpoint"], cfg["socket_path"],
        "Mesos must dial the unit's socket"
    );
    let root = str_of(&unmanaged["target_path_root"], "target_path_root");
    assert!(allowed(&cfg, &format!("{root}/some/target")));

    // The managed plugin: Mesos sets CSI_ENDPOINT, and the command must not override it.
    let managed: Value = serde_json::from_str(&read("packaging/mesos/ebs-managed.json")).unwrap();
    assert_eq!(managed["type"], cfg["driver_name"]);
    let container = &managed["containers"][0];
    assert_eq!(container["services"], serde_json::json!(["NODE_SERVICE"]));
    let command = &container["command"];
    assert_eq!(command["value"], "/usr/local/bin/ebs-node-agent");
    let argv: Vec<String> = command["arguments"].as_array().unwrap()[1..]
        .iter()
        .map(|a| str_of(a, "argument").to_string())
        .collect();
    assert_eq!(argv[0], "serve");
    let mesos_socket = "/var/lib/mesos/csi/plugins/x/endpoint.sock";
    let managed_cfg = print_config(
        &argv[1..],
        &[("CSI_ENDPOINT".into(), format!("unix://{mesos_socket}"))],
    );
    assert_eq!(managed_cfg["socket_path"], mesos_socket);
    assert_eq!(managed_cfg["mode"], "node");
    let root = str_of(&managed["target_path_root"], "target_path_root");
    assert!(allowed(&managed_cfg, &format!("{root}/some/target")));
}

#[test]
fn dockerfile_ships_the_binary_and_the_tools_it_runs() {
    let text = read("packaging/container/Dockerfile");
    for pkg in [
        "e2fsprogs",
        "xfsprogs",
        "util-linux",
        "libblkid1",
        "libudev1",
    ] {
        assert!(text.contains(pkg), "runtime image lacks {pkg}");
    }
    assert!(text.contains("ENTRYPOINT [\"/usr/local/bin/ebs-node-agent\"]"));
    assert!(text.contains("--bin ebs-node-agent"));
    // The image's default socket is the one the DaemonSet and Nomad jobs use.
    assert!(text.contains("CSI_ENDPOINT=unix:///csi/csi.sock"));
    assert!(read("packaging/kubernetes/daemonset.yaml").contains("unix:///csi/csi.sock"));
    // The man page and completions come from the binary's own subcommands.
    assert!(text.contains("ebs-node-agent man --dir /out/man"));
    assert!(text.contains("COPY --from=build /out/man/ /usr/local/share/man/man1/"));
    assert!(text.contains("ebs-node-agent completions bash"));
}

/// `--version`, the man page and the completions are generated from the clap definitions, so
/// they name every subcommand and flag the binary has.
#[test]
fn version_man_page_and_completions_come_from_the_flags() {
    let run = |args: &[&str]| {
        let out = std::process::Command::new(agent_bin())
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let version = run(&["--version"]);
    assert_eq!(
        version.trim(),
        format!("ebs-node-agent {}", env!("CARGO_PKG_VERSION"))
    );
    let man = run(&["man"]);
    assert!(man.contains(".TH ebs-node-agent 1"), "{man}");
    for sub in ["serve", "client", "status", "recover", "doctor"] {
        assert!(man.contains(sub), "man page lacks {sub}");
    }
    // One page per subcommand: the serve page lists serve's flags.
    let dir = std::env::temp_dir().join(format!("ebs-man-{}", std::process::id()));
    run(&["man", "--dir", dir.to_str().unwrap()]);
    let serve = std::fs::read_to_string(dir.join("ebs-node-agent-serve.1"));
    let top = std::fs::read_to_string(dir.join("ebs-node-agent.1"));
    let _ = std::fs::remove_dir_all(&dir);
    let serve = serve.unwrap();
    assert!(serve.contains("allowed\\-path\\-prefix"), "{serve}");
    assert!(top.unwrap().contains(".TH ebs-node-agent 1"));
    let bash = run(&["completions", "bash"]);
    assert!(bash.contains("--allowed-path-prefix") && bash.contains("doctor"));
    for shell in ["zsh", "fish"] {
        assert!(run(&["completions", shell]).contains("ebs-node-agent"));
    }
}
