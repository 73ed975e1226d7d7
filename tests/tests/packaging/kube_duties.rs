//! The Kubernetes duties in the shipped manifests: the service account and its minimal RBAC
//! (upstream's node rules), the token in the agent's container only, the node name, the pre-stop
//! hook (ours and the upstream chart's), and a grace period that outlasts hook and drain.

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use ebs_tests::*;
use serde_json::Value;

use crate::manifests::*;

const SA_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// Runs a hook's command (its program replaced by the agent under test) with the container's
/// environment, outside any cluster: it must exit 0 at once, saying there is nothing to do.
fn run_hook_outside_a_cluster(words: &[String], env: &[(String, String)]) {
    let out = Command::new("timeout")
        .arg("20")
        .arg(agent_bin())
        .args(words)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .expect("run the hook");
    let text =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "hook {words:?}: {:?}\n{text}",
        out.status
    );
    assert!(text.contains("pre-stop: nothing to do"), "{text}");
}

fn env_value(c: &Value, name: &str) -> Option<String> {
    c["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)
        .and_then(|e| e["value"].as_str().map(str::to_string))
}

/// The pod's grace covers the longest pre-stop wait plus the agent's shutdown grace.
pub fn check_grace(pod: &Value, agent: &Value, cfg: &Value) {
    let pre_stop = env_value(agent, "EBS_AGENT_PRE_STOP_TIMEOUT").unwrap_or_else(|| "40s".into());
    let pre_stop = ebs_node_core::config::parse_duration(&pre_stop).expect("pre-stop timeout");
    let drain = Duration::from_millis(cfg["shutdown_grace_ms"].as_u64().expect("grace"));
    let grace = Duration::from_secs(
        pod["terminationGracePeriodSeconds"]
            .as_u64()
            .expect("grace"),
    );
    assert!(
        pre_stop + drain < grace,
        "pre-stop {pre_stop:?} + drain {drain:?} must fit in terminationGracePeriodSeconds {grace:?}"
    );
}

fn rules(role: &Value) -> BTreeSet<(String, String, String)> {
    let mut out = BTreeSet::new();
    for r in role["rules"].as_array().expect("rules") {
        for g in r["apiGroups"].as_array().expect("apiGroups") {
            for res in r["resources"].as_array().expect("resources") {
                for v in r["verbs"].as_array().expect("verbs") {
                    out.insert((
                        str_of(g, "group").into(),
                        str_of(res, "resource").into(),
                        str_of(v, "verb").into(),
                    ));
                }
            }
        }
    }
    out
}

pub fn check_daemonset(ds: &Value, cfg: &Value) {
    let pod = &ds["spec"]["template"]["spec"];
    let containers = pod["containers"].as_array().expect("containers");
    let agent = find(&pod["containers"], "ebs-node-agent");

    // The service account, bound to exactly upstream's node rules, in the DaemonSet's namespace.
    let rbac = yaml_docs("packaging/kubernetes/rbac.yaml");
    let kz = yaml_docs("packaging/kubernetes/kustomization.yaml").remove(0);
    assert!(
        kz["resources"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r == "rbac.yaml")
    );
    let of = |kind: &str| {
        rbac.iter()
            .find(|d| d["kind"] == kind)
            .unwrap_or_else(|| panic!("no {kind}"))
    };
    let sa = of("ServiceAccount");
    assert_eq!(pod["serviceAccountName"], sa["metadata"]["name"]);
    assert_eq!(sa["metadata"]["namespace"], ds["metadata"]["namespace"]);
    let (role, binding) = (of("ClusterRole"), of("ClusterRoleBinding"));
    assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"]);
    assert_eq!(binding["subjects"][0]["name"], sa["metadata"]["name"]);
    assert_eq!(
        binding["subjects"][0]["namespace"],
        sa["metadata"]["namespace"]
    );
    let want: BTreeSet<(String, String, String)> = [
        ("", "nodes", "get"),
        ("", "nodes", "list"),
        ("", "nodes", "watch"),
        ("", "nodes", "patch"),
        ("storage.k8s.io", "csinodes", "get"),
        ("storage.k8s.io", "volumeattachments", "get"),
        ("storage.k8s.io", "volumeattachments", "list"),
        ("storage.k8s.io", "volumeattachments", "watch"),
    ]
    .into_iter()
    .map(|(g, r, v)| (g.into(), r.into(), v.into()))
    .collect();
    assert_eq!(rules(role), want);

    // The token only where it is used: no automount, one projected volume in the agent alone.
    assert_eq!(pod["automountServiceAccountToken"], false);
    let access = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| !v["projected"].is_null())
        .expect("a projected token volume");
    let sources = access["projected"]["sources"].as_array().unwrap();
    assert!(
        sources
            .iter()
            .any(|s| s["serviceAccountToken"]["path"] == "token")
    );
    assert!(
        sources
            .iter()
            .any(|s| s["configMap"]["items"][0]["path"] == "ca.crt")
    );
    for c in containers {
        let mounts_it = c["volumeMounts"]
            .as_array()
            .is_some_and(|m| m.iter().any(|m| m["name"] == access["name"]));
        assert_eq!(mounts_it, c["name"] == "ebs-node-agent", "{}", c["name"]);
    }
    let mount = agent["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == access["name"])
        .unwrap();
    assert_eq!(mount["mountPath"], SA_DIR);
    assert_eq!(cfg["service_account_dir"], SA_DIR);

    // The node's name from the downward API; startup-taint removal on.
    let node = agent["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "CSI_NODE_NAME")
        .expect("CSI_NODE_NAME");
    assert_eq!(node["valueFrom"]["fieldRef"]["fieldPath"], "spec.nodeName");
    assert_eq!(cfg["kube_node_name"], "ip-10-0-0-1.ec2.internal");
    assert_eq!(cfg["startup_taint_removal"], true);

    // The preStop hook: the installed binary's `pre-stop`.
    let hook: Vec<String> = agent["lifecycle"]["preStop"]["exec"]["command"]
        .as_array()
        .expect("a preStop exec hook")
        .iter()
        .map(|w| str_of(w, "word").to_string())
        .collect();
    let dockerfile = read("packaging/container/Dockerfile");
    assert!(
        dockerfile.contains(&format!("ENTRYPOINT [\"{}\"]", hook[0])),
        "{hook:?}"
    );
    run_hook_outside_a_cluster(&hook[1..], &container_env(agent, &[]));
    check_grace(pod, agent, cfg);
}

/// The upstream chart's hook kept as it is: its program name is the agent in our image, and its
/// words are the agent's pre-stop.
pub fn check_chart_hook(ds: &Value, agent: &Value, command: &str, dockerfile: &str) {
    let chart = yaml_docs("tests/fixtures/aws-ebs-csi-driver-2.64-node.yaml").remove(0);
    let theirs = find(
        &chart["spec"]["template"]["spec"]["containers"],
        "ebs-plugin",
    );
    assert_eq!(agent["lifecycle"], theirs["lifecycle"]);
    let hook: Vec<String> = agent["lifecycle"]["preStop"]["exec"]["command"]
        .as_array()
        .expect("the chart's preStop hook")
        .iter()
        .map(|w| str_of(w, "word").to_string())
        .collect();
    assert_eq!(hook[0], "/bin/aws-ebs-csi-driver");
    // bookworm-slim's /bin is a link to /usr/bin.
    assert!(
        dockerfile.contains(&format!("ln -s {command} /usr/bin/aws-ebs-csi-driver")),
        "the image must answer to {}",
        hook[0]
    );
    run_hook_outside_a_cluster(&hook[1..], &container_env(agent, &[]));
    assert_eq!(
        ds["spec"]["template"]["spec"]["serviceAccountName"],
        "ebs-csi-node-sa"
    );
}
