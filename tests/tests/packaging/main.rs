//! The shipped deployment files, checked against the agent itself: every manifest, job and unit
//! is parsed, and the settings it gives the agent are handed to `serve --print-config`, so the
//! socket paths, mode, directories and prefixes an orchestrator uses are compared with what the
//! agent would really run with. One source of truth: the agent's own flag parsing.

mod hosts;
mod kube_duties;
mod layout;
mod manifests;
mod release;
mod upstream_chart;

use std::path::Path;

use manifests::*;
use serde_json::Value;

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
    let env = container_env(agent, &[]);
    let cfg = print_config(&args, &env);
    // Kubernetes 1.35+ copies the node's topology labels onto the pod: the zone without
    // instance metadata; without the labels the value is empty and means nothing.
    assert!(cfg["zone"].is_null(), "{cfg}");
    let labelled = print_config(
        &args,
        &container_env(agent, &[("topology.kubernetes.io/zone", "us-east-2b")]),
    );
    assert_eq!(labelled["zone"], "us-east-2b");

    // Node only, no cloud credentials; the API token for the agent's container alone.
    assert_eq!(cfg["mode"], "node");
    assert_eq!(cfg["serves_controller"], false);
    assert!(env.iter().all(|(k, _)| !k.starts_with("AWS_")), "{env:?}");
    assert!(
        pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|v| v["secret"].is_null())
    );
    kube_duties::check_daemonset(&ds, &cfg);
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
    let plugin_volume =
        mount_of(find(containers, "node-driver-registrar"), socket_dir)["name"].clone();
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
    // The agent reaches that very directory at its socket path, and by no other name: a second
    // name below an allowed prefix (issue 49: `/csi` was also `/var/lib/kubelet/plugins/<driver>`)
    // would let a stage there cover the socket kubelet dials.
    let state_dir = str_of(&cfg["state_dir"], "state_dir");
    assert_eq!(
        host_path_in(pod, agent, socket_dir),
        Some(plugin_host.clone())
    );
    for dir in [socket_dir, state_dir] {
        let host = host_path_in(pod, agent, dir).unwrap_or_else(|| panic!("{dir} not mounted"));
        assert_eq!(
            names_in(pod, agent, &host),
            vec![dir.to_string()],
            "the agent's {dir} has other names in its container"
        );
    }
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
    let state = mount_of(agent, state_dir);
    assert!(find(&pod["volumes"], str_of(&state["name"], "state"))["hostPath"].is_object());

    // Liveness: the port kubelet probes is the one the livenessprobe sidecar serves.
    let probe = find(containers, "liveness-probe");
    let port = find(&agent["ports"], "healthz")["containerPort"]
        .as_i64()
        .unwrap();
    assert_eq!(flag(&probe["args"], "health-port"), port.to_string());
    assert_eq!(agent["livenessProbe"]["httpGet"]["port"], "healthz");

    // Shutdown: the pod's grace outlasts the pre-stop wait and the agent's drain after it
    // (kube_duties); metrics stay on loopback.
    assert!(is_loopback(str_of(&cfg["metrics_address"], "metrics")));
}

/// The container's hostPath mounts as (container path, host path), without trailing slashes.
fn host_mounts(pod: &Value, c: &Value) -> Vec<(String, String)> {
    c["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| {
            let v = find(&pod["volumes"], str_of(&m["name"], "name"));
            let host = v["hostPath"]["path"].as_str()?;
            Some((
                str_of(&m["mountPath"], "mountPath")
                    .trim_end_matches('/')
                    .to_string(),
                host.trim_end_matches('/').to_string(),
            ))
        })
        .collect()
}

/// The host directory `container_path` is in container `c` (through its deepest mount).
fn host_path_in(pod: &Value, c: &Value, container_path: &str) -> Option<String> {
    host_mounts(pod, c)
        .into_iter()
        .filter_map(|(at, host)| {
            let rest = Path::new(container_path).strip_prefix(&at).ok()?;
            Some((at.len(), Path::new(&host).join(rest)))
        })
        .max_by_key(|(len, _)| *len)
        .map(|(_, p)| p.to_string_lossy().trim_end_matches('/').to_string())
}

/// Every path in container `c` that reaches the host directory `host`.
fn names_in(pod: &Value, c: &Value, host: &str) -> Vec<String> {
    let mut names: Vec<String> = host_mounts(pod, c)
        .into_iter()
        .filter_map(|(at, from)| {
            let rest = Path::new(host).strip_prefix(&from).ok()?;
            let name = Path::new(&at).join(rest);
            // Reached through this mount only if no deeper mount covers it.
            (host_path_in(pod, c, name.to_str()?).as_deref() == Some(host))
                .then(|| name.to_string_lossy().trim_end_matches('/').to_string())
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

/// The CSIDriver object is the upstream chart's: a cluster switching from the chart to these
/// manifests (or back) changes no driver behaviour. Every spec field the chart renders has the
/// chart's value here; what this file adds is only the API server's own defaults.
#[test]
fn the_csidriver_object_matches_the_upstream_charts_rendering() {
    let ours = yaml_docs("packaging/kubernetes/csidriver.yaml").remove(0);
    let theirs = yaml_docs("tests/fixtures/aws-ebs-csi-driver-2.64-csidriver.yaml").remove(0);
    assert_eq!(ours["metadata"]["name"], theirs["metadata"]["name"]);
    let (ours, theirs) = (
        ours["spec"].as_object().expect("spec"),
        theirs["spec"].as_object().expect("spec"),
    );
    for (field, value) in theirs {
        assert_eq!(ours.get(field), Some(value), "spec.{field}");
    }
    // The rest: what the API server fills in anyway.
    let defaults = [
        ("volumeLifecycleModes", serde_json::json!(["Persistent"])),
        ("requiresRepublish", serde_json::json!(false)),
    ];
    for (field, value) in ours.iter().filter(|(f, _)| !theirs.contains_key(*f)) {
        assert!(
            defaults.iter().any(|(d, v)| d == field && v == value),
            "spec.{field} = {value} is not the chart's and not a default"
        );
    }
}
