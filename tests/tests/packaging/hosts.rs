//! The host-level packaging: Nomad jobs, the systemd unit and its environment file, Mesos.

use std::path::Path;
use std::process::Command;

use ebs_tests::*;
use serde_json::Value;

use crate::manifests::*;

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
    // The image's default socket is the one the Nomad jobs use; the DaemonSet sets its own at
    // its host path (one name below the allowed prefix: issue 49).
    assert!(text.contains("CSI_ENDPOINT=unix:///csi/csi.sock"));
    assert!(
        read("packaging/kubernetes/daemonset.yaml")
            .contains("unix:///var/lib/kubelet/plugins/ebs.csi.aws.com/csi.sock")
    );
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
