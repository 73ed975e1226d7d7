//! packaging/kubernetes/upstream-chart: the upstream chart's node DaemonSet (a rendered fixture)
//! with the patch applied, checked against the agent's own reading of the result.

use std::path::Path;
use std::process::Command;

use ebs_tests::*;
use serde_json::Value;

use crate::manifests::*;

/// A strategic merge patch as kustomize applies one to these objects: maps merge, `null`
/// removes, lists of objects merge by `name` (`mountPath` for volumeMounts), other lists are
/// replaced.
fn strategic_merge(base: &mut Value, patch: &Value, field: &str) {
    match (base, patch) {
        (Value::Object(b), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    b.remove(k);
                } else if let Some(slot) = b.get_mut(k) {
                    strategic_merge(slot, v, k);
                } else {
                    b.insert(k.clone(), v.clone());
                }
            }
        }
        (Value::Array(b), Value::Array(p)) if p.iter().all(Value::is_object) => {
            let key = if field == "volumeMounts" {
                "mountPath"
            } else {
                "name"
            };
            for item in p {
                match b.iter_mut().find(|x| x[key] == item[key]) {
                    Some(slot) => strategic_merge(slot, item, ""),
                    None => b.insert(0, item.clone()),
                }
            }
        }
        (b, p) => *b = p.clone(),
    }
}

#[test]
fn upstream_chart_patch_runs_the_agent_as_the_charts_node_plugin() {
    let mut ds = yaml_docs("tests/fixtures/aws-ebs-csi-driver-2.64-node.yaml").remove(0);
    let patch = yaml_docs("packaging/kubernetes/upstream-chart/ebs-plugin-patch.yaml").remove(0);
    let kz = yaml_docs("packaging/kubernetes/upstream-chart/kustomization.yaml").remove(0);
    assert_eq!(kz["patches"][0]["path"], "ebs-plugin-patch.yaml");
    assert_eq!(kz["patches"][0]["target"]["name"], ds["metadata"]["name"]);
    let chart_args =
        find(&ds["spec"]["template"]["spec"]["containers"], "ebs-plugin")["args"].clone();
    strategic_merge(&mut ds, &patch, "");
    let pod = &ds["spec"]["template"]["spec"];
    let agent = find(&pod["containers"], "ebs-plugin");

    // The image's entrypoint; the chart's arguments and its pre-stop hook untouched.
    let dockerfile = read("packaging/container/Dockerfile");
    let command = str_of(&agent["command"][0], "command");
    assert!(dockerfile.contains(&format!("ENTRYPOINT [\"{command}\"]")));
    assert_eq!(agent["args"], chart_args);
    crate::kube_duties::check_chart_hook(&ds, agent, command, &dockerfile);
    assert_eq!(agent["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(agent["securityContext"]["privileged"], true);

    let run = |labels: &[(&str, &str)]| {
        let env = container_env(agent, labels);
        let mut argv: Vec<String> = vec![command.to_string()];
        argv.extend(
            agent["args"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| expand(str_of(a, "arg"), &env)),
        );
        // The image's entrypoint is the program itself: what follows it is the argv.
        print_config_argv(&argv[1..], &env)
    };
    let cfg = run(&[]);
    assert_eq!(cfg["mode"], "node");
    assert_eq!(cfg["ignored_upstream_flags"], serde_json::json!([]));
    assert!(cfg["zone"].is_null(), "an absent label is no zone: {cfg}");
    assert_eq!(
        cfg["csi_mount_point_prefix"],
        "/var/lib/kubelet/plugins/kubernetes.io/csi/ebs.csi.aws.com/"
    );
    // Kubernetes 1.35+: the zone and region from the pod's copied topology labels.
    let labelled = run(&[
        ("topology.kubernetes.io/zone", "eu-west-1c"),
        ("topology.kubernetes.io/region", "eu-west-1"),
    ]);
    assert_eq!(labelled["zone"], "eu-west-1c");
    assert_eq!(labelled["region"], "eu-west-1");

    // The socket the chart's registrar and livenessprobe dial, in the directory they share.
    let socket = str_of(&cfg["socket_path"], "socket");
    let registrar = find(&pod["containers"], "node-driver-registrar");
    let reg_env = container_env(registrar, &[]);
    assert_eq!(
        expand(flag(&registrar["args"], "csi-address"), &reg_env),
        socket
    );
    let probe = find(&pod["containers"], "liveness-probe");
    assert_eq!(flag(&probe["args"], "csi-address"), socket);
    let mount = |path: &str| {
        agent["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["mountPath"] == path)
            .cloned()
            .unwrap_or_else(|| panic!("ebs-plugin does not mount {path}"))
    };
    let socket_dir = Path::new(socket).parent().unwrap().to_str().unwrap();
    assert_eq!(mount(socket_dir)["name"], "plugin-dir");

    // The state file on the host; kubelet's directory, Bidirectional, allowed.
    let state = mount(str_of(&cfg["state_dir"], "state_dir"));
    let volume = find(&pod["volumes"], str_of(&state["name"], "state volume"));
    assert_eq!(volume["hostPath"]["path"], cfg["state_dir"]);
    assert_eq!(
        mount("/var/lib/kubelet")["mountPropagation"],
        "Bidirectional"
    );
    assert!(allowed(
        &cfg,
        "/var/lib/kubelet/plugins/kubernetes.io/csi/ebs.csi.aws.com/x/globalmount"
    ));
    assert!(allowed(
        &cfg,
        "/var/lib/kubelet/pods/uid/volumes/kubernetes.io~csi/pv/mount"
    ));
    // The pod's grace outlasts the pre-stop wait and the agent's drain after it.
    crate::kube_duties::check_grace(pod, agent, &cfg);

    // Where kubectl is at hand, kustomize itself applies the patch the same way.
    if let Ok(out) = Command::new("kubectl")
        .arg("version")
        .arg("--client")
        .output()
        && out.status.success()
    {
        let dir = Scratch::new("upstream-chart-kustomize");
        for f in ["kustomization.yaml", "ebs-plugin-patch.yaml"] {
            std::fs::write(
                dir.join(f),
                read(&format!("packaging/kubernetes/upstream-chart/{f}")),
            )
            .unwrap();
        }
        std::fs::write(
            dir.join("rendered.yaml"),
            read("tests/fixtures/aws-ebs-csi-driver-2.64-node.yaml"),
        )
        .unwrap();
        let out = Command::new("kubectl")
            .arg("kustomize")
            .arg(&dir.path)
            .output()
            .expect("kubectl kustomize");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let docs = yaml_rust2::YamlLoader::load_from_str(&String::from_utf8_lossy(&out.stdout))
            .expect("kustomize output");
        let real = yaml_to_json(&docs[0]);
        let real_pod = &real["spec"]["template"]["spec"];
        let real_agent = find(&real_pod["containers"], "ebs-plugin");
        for field in ["image", "command", "args", "securityContext", "lifecycle"] {
            assert_eq!(real_agent[field], agent[field], "{field}");
        }
        let names = |c: &Value, list: &str, key: &str| {
            let mut v: Vec<String> = c[list]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x[key].to_string())
                .collect();
            v.sort();
            v
        };
        assert_eq!(
            names(real_agent, "env", "name"),
            names(agent, "env", "name")
        );
        assert_eq!(
            names(real_agent, "volumeMounts", "mountPath"),
            names(agent, "volumeMounts", "mountPath")
        );
        assert_eq!(
            names(real_pod, "volumes", "name"),
            names(pod, "volumes", "name")
        );
        assert_eq!(
            real_pod["terminationGracePeriodSeconds"],
            pod["terminationGracePeriodSeconds"]
        );
    }
}
