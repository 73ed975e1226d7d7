//! The node pod's Kubernetes duties against a real API server (etcd + kube-apiserver, RBAC on,
//! the agent holding a token of the shipped service account bound by the shipped rbac.yaml):
//! the startup taint goes only after CSINode shows the driver with a count (or, where the agent
//! reports no attach limit, once it shows the driver), a concurrent taint
//! change is never overwritten, the window ends with a log line; `pre-stop` waits on a drain
//! until the node's VolumeAttachments of this driver are gone, returns at once without one, and
//! keeps to its timeout. One API server for all scenarios (it takes a while to start on 2 cores);
//! each scenario has nodes of its own.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ebs_node_agent_kube::objects::Node;
use ebs_node_agent_kube::{Client, InCluster, STARTUP_TAINT, taint};
use ebs_tests::apiserver::ApiServer;
use ebs_tests::*;

const DRIVER: &str = "ebs.csi.aws.com";

fn node_yaml(name: &str, taints: &[(&str, &str)], unschedulable: bool) -> String {
    let taints: Vec<String> = taints
        .iter()
        .map(|(k, e)| format!("{{key: \"{k}\", effect: {e}}}"))
        .collect();
    format!(
        "apiVersion: v1\nkind: Node\nmetadata: {{name: {name}}}\nspec: {{unschedulable: {unschedulable}, taints: [{}]}}\n",
        taints.join(", ")
    )
}

fn csinode_yaml(node: &str, driver: &str, count: Option<u32>) -> String {
    let alloc = count
        .map(|c| format!(", allocatable: {{count: {c}}}"))
        .unwrap_or_default();
    format!(
        "apiVersion: storage.k8s.io/v1\nkind: CSINode\nmetadata: {{name: {node}}}\nspec:\n  drivers: [{{name: {driver}, nodeID: {node}{alloc}}}]\n"
    )
}

fn va_yaml(name: &str, node: &str, attacher: &str) -> String {
    format!(
        "apiVersion: storage.k8s.io/v1\nkind: VolumeAttachment\nmetadata: {{name: {name}}}\nspec: {{attacher: {attacher}, nodeName: {node}, source: {{persistentVolumeName: pv-{name}}}}}\n"
    )
}

fn taint_keys(api: &ApiServer, node: &str) -> Vec<String> {
    let n = api.get_json(&["node", node]).expect("node");
    n["spec"]["taints"]
        .as_array()
        .map(|t| {
            t.iter()
                .filter_map(|t| t["key"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn without_startup_taint(keys: Vec<String>) -> Vec<String> {
    keys.into_iter().filter(|k| k != STARTUP_TAINT).collect()
}

/// `serve` with the loop backend, in a "pod" on `node` with the shipped service account.
async fn agent_on(
    api: &ApiServer,
    sa: &Path,
    scratch: &Scratch,
    node: &str,
    extra: &[&str],
) -> Agent {
    let mut args = AgentOpts::default().args;
    args.extend(extra.iter().map(|s| s.to_string()));
    let opts = AgentOpts {
        args,
        env: api.pod_env(sa, node),
        ..Default::default()
    };
    Agent::start(scratch, opts).await
}

struct PreStop {
    child: Child,
    log: PathBuf,
    started: Instant,
}

impl PreStop {
    fn start(api: &ApiServer, sa: &Path, node: &str, timeout: &str, log: PathBuf) -> PreStop {
        let file = std::fs::File::create(&log).expect("log");
        let child = Command::new(agent_bin())
            .args(["pre-stop", "--timeout", timeout])
            .env_clear()
            .envs(api.pod_env(sa, node))
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log"))
            .stderr(file)
            .spawn()
            .expect("pre-stop");
        PreStop {
            child,
            log,
            started: Instant::now(),
        }
    }

    fn text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Still running after `d`?
    fn still_running_after(&mut self, d: Duration) -> bool {
        std::thread::sleep(d);
        self.child.try_wait().expect("try_wait").is_none()
    }

    /// Its exit code, within `limit`.
    fn exit_within(&mut self, limit: Duration) -> (i32, Duration) {
        let end = Instant::now() + limit;
        loop {
            if let Some(st) = self.child.try_wait().expect("try_wait") {
                return (st.code().unwrap_or(-1), self.started.elapsed());
            }
            assert!(
                Instant::now() < end,
                "pre-stop still running after {limit:?}:\n{}",
                self.text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for PreStop {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wait_until(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) {
    let end = Instant::now() + limit;
    while !ok() {
        assert!(Instant::now() < end, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_duties_against_a_real_api_server() {
    let test = "kube_duties::kubernetes_duties_against_a_real_api_server";
    let Some(api) = ApiServer::start(test) else {
        return;
    };
    let scratch = Scratch::new("kube-duties");
    // The shipped service account and its ClusterRole: every call below runs under RBAC with
    // exactly the rules packaging/kubernetes/rbac.yaml grants.
    wait_until("the kube-system namespace", Duration::from_secs(60), || {
        api.kubectl(&["get", "namespace", "kube-system"]).is_ok()
    });
    api.apply(
        &std::fs::read_to_string(k8s::repo_root().join("packaging/kubernetes/rbac.yaml"))
            .expect("rbac.yaml"),
    );
    let sa = api.service_account_dir("kube-system", "ebs-node-agent");

    startup_taint(&api, &sa).await;
    startup_taint_without_an_attach_limit(&api, &sa).await;
    concurrent_taint_change(&api, &sa).await;
    give_up(&api, &sa).await;
    pre_stop(&api, &sa, &scratch);
}

/// Taint present → left alone while CSINode lacks the driver or its count → removed once it has
/// both, every other taint kept. Readiness never waited for it. The agent reports an attach limit
/// (as with EBS; here the loop backend's --volume-attach-limit), so kubelet publishes a count.
async fn startup_taint(api: &ApiServer, sa: &Path) {
    let node = "kd-taint";
    api.apply(&node_yaml(
        node,
        &[("dedicated", "NoSchedule"), (STARTUP_TAINT, "NoExecute")],
        false,
    ));
    api.apply(&csinode_yaml(node, "other.csi.example.com", Some(3)));
    let sub = Scratch::new("kube-duties-taint");
    // The API server adds node.kubernetes.io/not-ready itself (TaintNodesByCondition).
    let others = without_startup_taint(taint_keys(api, node));
    assert!(others.contains(&"dedicated".to_string()), "{others:?}");
    let agent = agent_on(api, sa, &sub, node, &["--volume-attach-limit", "25"]).await;
    // Ready (Agent::start waited for Probe) while the taint is still there.
    assert!(taint_keys(api, node).contains(&STARTUP_TAINT.to_string()));
    std::thread::sleep(Duration::from_secs(5));
    assert!(
        taint_keys(api, node).contains(&STARTUP_TAINT.to_string()),
        "removed before registration:\n{}",
        agent.log_text()
    );
    api.kubectl(&["delete", "csinode", node])
        .expect("delete csinode");
    api.apply(&csinode_yaml(node, DRIVER, None));
    std::thread::sleep(Duration::from_secs(5));
    assert!(
        taint_keys(api, node).contains(&STARTUP_TAINT.to_string()),
        "removed without an allocatable count:\n{}",
        agent.log_text()
    );
    api.kubectl(&["delete", "csinode", node])
        .expect("delete csinode");
    api.apply(&csinode_yaml(node, DRIVER, Some(25)));
    wait_until("the startup taint removed", Duration::from_secs(30), || {
        !taint_keys(api, node).contains(&STARTUP_TAINT.to_string())
    });
    assert_eq!(taint_keys(api, node), others);
    assert!(
        agent.log_text().contains("startup taint removed"),
        "{}",
        agent.log_text()
    );
}

/// The loop backend without --volume-attach-limit reports no limit (max_volumes_per_node 0), so
/// kubelet registers the driver with no allocatable count, ever: the registration alone is the
/// signal. Another driver's registration is not.
async fn startup_taint_without_an_attach_limit(api: &ApiServer, sa: &Path) {
    let node = "kd-taint-nolimit";
    api.apply(&node_yaml(node, &[(STARTUP_TAINT, "NoSchedule")], false));
    api.apply(&csinode_yaml(node, "other.csi.example.com", Some(3)));
    let sub = Scratch::new("kube-duties-taint-nolimit");
    let others = without_startup_taint(taint_keys(api, node));
    let agent = agent_on(api, sa, &sub, node, &[]).await;
    std::thread::sleep(Duration::from_secs(5));
    assert!(
        taint_keys(api, node).contains(&STARTUP_TAINT.to_string()),
        "removed before this driver's registration:\n{}",
        agent.log_text()
    );
    api.kubectl(&["delete", "csinode", node])
        .expect("delete csinode");
    api.apply(&csinode_yaml(node, DRIVER, None));
    wait_until(
        "the startup taint removed once the driver is registered (no count: the agent reports no limit)",
        Duration::from_secs(30),
        || !taint_keys(api, node).contains(&STARTUP_TAINT.to_string()),
    );
    assert_eq!(taint_keys(api, node), others);
    assert!(
        agent.log_text().contains("startup taint removed"),
        "{}",
        agent.log_text()
    );
}

/// The patch tests the taints it read: a taint added between the read and the patch makes the
/// server refuse it (nothing is overwritten); the removal then reads again and keeps the new one.
async fn concurrent_taint_change(api: &ApiServer, sa: &Path) {
    let node = "kd-race";
    api.apply(&node_yaml(node, &[(STARTUP_TAINT, "NoSchedule")], false));
    api.apply(&csinode_yaml(node, DRIVER, Some(25)));
    let env: Vec<(String, String)> = api.pod_env(sa, node);
    let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    let cfg = InCluster::detect(get, sa, Some(node)).expect("in cluster");
    let client = Client::new(&cfg).expect("client");
    let read: Node = client
        .get(&format!("/api/v1/nodes/{node}"))
        .await
        .expect("get")
        .expect("node");
    let patch = read.startup_taint_removal().expect("a patch");
    api.kubectl(&["taint", "nodes", node, "racer=1:NoSchedule"])
        .expect("taint");
    let others = without_startup_taint(taint_keys(api, node));
    assert!(others.contains(&"racer".to_string()), "{others:?}");
    let refused = client
        .json_patch(&format!("/api/v1/nodes/{node}"), &patch)
        .await;
    assert_eq!(
        refused.as_ref().err().and_then(|e| e.status()),
        Some(422),
        "{refused:?}"
    );
    let keys = taint_keys(api, node);
    assert!(
        keys.contains(&"racer".to_string()) && keys.contains(&STARTUP_TAINT.to_string()),
        "{keys:?}"
    );
    let outcome = taint::remove_startup_taint(&client, node, &taint::Settings::new(DRIVER)).await;
    assert_eq!(outcome, taint::Outcome::Removed);
    assert_eq!(taint_keys(api, node), others);
}

/// No registration within the window: the taint stays and one log line says so.
async fn give_up(api: &ApiServer, sa: &Path) {
    let node = "kd-giveup";
    api.apply(&node_yaml(node, &[(STARTUP_TAINT, "NoSchedule")], false));
    let sub = Scratch::new("kube-duties-giveup");
    let agent = agent_on(api, sa, &sub, node, &["--startup-taint-window", "3s"]).await;
    wait_until("the give-up line", Duration::from_secs(30), || {
        agent.log_text().contains("giving up")
    });
    assert!(taint_keys(api, node).contains(&STARTUP_TAINT.to_string()));
}

fn pre_stop(api: &ApiServer, sa: &Path, scratch: &Scratch) {
    let log = |n: &str| scratch.join(&format!("pre-stop-{n}.log"));
    // A drain (Karpenter's taint): waits for this node's attachments of this driver only.
    let node = "kd-drain";
    api.apply(&node_yaml(
        node,
        &[("karpenter.sh/disrupted", "NoSchedule")],
        false,
    ));
    api.apply(&node_yaml("kd-plain", &[], false));
    for (va, n, attacher) in [
        ("va-1", node, DRIVER),
        ("va-2", node, DRIVER),
        ("va-other-node", "kd-plain", DRIVER),
        ("va-other-driver", node, "other.csi.example.com"),
    ] {
        api.apply(&va_yaml(va, n, attacher));
    }
    let mut hook = PreStop::start(api, sa, node, "120s", log("drain"));
    assert!(
        hook.still_running_after(Duration::from_secs(3)),
        "returned with two attachments left:\n{}",
        hook.text()
    );
    api.kubectl(&["delete", "volumeattachment", "va-1"])
        .expect("delete");
    assert!(
        hook.still_running_after(Duration::from_secs(3)),
        "returned with one attachment left:\n{}",
        hook.text()
    );
    api.kubectl(&["delete", "volumeattachment", "va-2"])
        .expect("delete");
    let (code, _) = hook.exit_within(Duration::from_secs(30));
    assert_eq!(code, 0, "{}", hook.text());
    for va in ["va-other-node", "va-other-driver"] {
        assert!(
            api.get_json(&["volumeattachment", va]).is_some(),
            "{va} is not ours to wait for"
        );
    }

    // No drain: returns at once, attachments or not.
    let mut hook = PreStop::start(api, sa, "kd-plain", "120s", log("plain"));
    let (code, took) = hook.exit_within(Duration::from_secs(30));
    assert_eq!(code, 0, "{}", hook.text());
    assert!(hook.text().contains("not being drained"), "{}", hook.text());
    assert!(took < Duration::from_secs(30));

    // A cordon (spec.unschedulable) counts; the timeout bounds the wait: exit 1 when it is up.
    api.apply(&node_yaml("kd-cordon", &[], true));
    api.apply(&va_yaml("va-cordon", "kd-cordon", DRIVER));
    let mut hook = PreStop::start(api, sa, "kd-cordon", "3s", log("cordon"));
    let (code, took) = hook.exit_within(Duration::from_secs(30));
    assert_eq!(code, 1, "{}", hook.text());
    assert!(
        took >= Duration::from_secs(3),
        "{took:?}: did not wait\n{}",
        hook.text()
    );
    assert!(hook.text().contains("time is up"), "{}", hook.text());

    // The node object already gone (instance terminating): waits too, as upstream.
    api.apply(&va_yaml("va-gone", "kd-gone", DRIVER));
    let mut hook = PreStop::start(api, sa, "kd-gone", "120s", log("gone"));
    assert!(
        hook.still_running_after(Duration::from_secs(3)),
        "{}",
        hook.text()
    );
    api.kubectl(&["delete", "volumeattachment", "va-gone"])
        .expect("delete");
    let (code, _) = hook.exit_within(Duration::from_secs(30));
    assert_eq!(code, 0, "{}", hook.text());
}
