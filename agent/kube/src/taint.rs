//! Startup-taint removal, as upstream's node service does it: within a window (10 minutes) from
//! the agent's start, once the node carries `ebs.csi.aws.com/agent-not-ready` and CSINode shows
//! this driver with an allocatable count, remove that taint with a JSON patch whose `test`
//! operation makes a concurrent change to the taints fail the patch instead of being overwritten.
//! Where the agent itself reports no attach limit (the loop backend without
//! --volume-attach-limit: max_volumes_per_node 0), kubelet publishes no count, ever: the driver's
//! registration in CSINode is then the signal ([`Settings::count_expected`]).
//! Runs in the background: CSI serving and readiness never wait for it.

use std::time::Duration;

use tokio::time::Instant;

use crate::client::{Client, Error};
use crate::objects::{CsiNode, Node};

#[derive(Clone, Debug)]
pub struct Settings {
    pub driver: String,
    /// Upstream's 10 minutes: after that the taint is left alone, with a log line.
    pub window: Duration,
    /// While tainted: how often CSINode is read for the registration.
    pub poll: Duration,
    /// The agent reports an attach limit (NodeGetInfo's max_volumes_per_node > 0), so kubelet
    /// registers the driver with an allocatable count, and the taint waits for that count as
    /// upstream's does. False: the registration alone.
    pub count_expected: bool,
}

impl Settings {
    pub fn new(driver: &str) -> Settings {
        Settings {
            driver: driver.to_string(),
            window: Duration::from_secs(600),
            poll: Duration::from_secs(2),
            count_expected: true,
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    Removed,
    /// The window ended; the string says in what state.
    GaveUp(String),
}

/// A bounded pause after a failure: 1 s doubling to 30 s.
struct Backoff(Duration);

impl Backoff {
    fn next(&mut self) -> Duration {
        let d = self.0;
        self.0 = (self.0 * 2).min(Duration::from_secs(30));
        d
    }
    fn reset(&mut self) {
        self.0 = Duration::from_secs(1);
    }
}

pub async fn remove_startup_taint(client: &Client, node_name: &str, s: &Settings) -> Outcome {
    let deadline = Instant::now() + s.window;
    let node_path = format!("/api/v1/nodes/{node_name}");
    let csinode_path = format!("/apis/storage.k8s.io/v1/csinodes/{node_name}");
    let mut backoff = Backoff(Duration::from_secs(1));
    let mut failures = 0u32;
    let mut last = String::from("the node never carried the taint");
    let fail = |failures: &mut u32, what: &str, e: &Error| {
        // The first failure and every tenth after it: a down API server must not flood the log.
        if failures.is_multiple_of(10) {
            tracing::warn!(error = %e, "startup taint: {what} failed; retrying");
        }
        *failures += 1;
    };
    let pause = |d: Duration| tokio::time::sleep_until((Instant::now() + d).min(deadline));

    while Instant::now() < deadline {
        let node = match client.get::<Node>(&node_path).await {
            Ok(Some(n)) => n,
            Ok(None) => {
                last = "the node object does not exist".into();
                pause(backoff.next()).await;
                continue;
            }
            Err(e) => {
                fail(&mut failures, "reading the node", &e);
                last = format!("reading the node failed: {e}");
                pause(backoff.next()).await;
                continue;
            }
        };
        let Some(patch) = node.startup_taint_removal() else {
            // Not tainted (yet): watch the node until it is, or the window ends.
            if let Err(e) = wait_for_taint(client, node_name, &node, deadline).await {
                fail(&mut failures, "watching the node", &e);
                pause(backoff.next()).await;
            }
            continue;
        };
        match client.get::<CsiNode>(&csinode_path).await {
            Ok(Some(c)) if s.count_expected && c.registered_with_count(&s.driver) => {}
            Ok(Some(c)) if !s.count_expected && c.registered(&s.driver) => {}
            Ok(_) => {
                last = if s.count_expected {
                    "kubelet has not registered the driver with an allocatable count"
                } else {
                    "kubelet has not registered the driver"
                }
                .into();
                pause(s.poll).await;
                continue;
            }
            Err(e) => {
                fail(&mut failures, "reading CSINode", &e);
                last = format!("reading CSINode failed: {e}");
                pause(backoff.next()).await;
                continue;
            }
        }
        match client.json_patch(&node_path, &patch).await {
            Ok(()) => {
                tracing::info!(
                    node = node_name,
                    taint = crate::STARTUP_TAINT,
                    "startup taint removed: the driver is registered"
                );
                return Outcome::Removed;
            }
            // The taints changed since they were read (the `test` failed) or the node was
            // replaced: read it again, at once.
            Err(e) if matches!(e.status(), Some(409 | 422)) => {
                tracing::info!(error = %e, "startup taint: the taints changed meanwhile; reading the node again");
                backoff.reset();
            }
            Err(e) => {
                fail(&mut failures, "patching the node", &e);
                last = format!("patching the node failed: {e}");
                pause(backoff.next()).await;
            }
        }
    }
    let why = format!("{last}; giving up after {:?}", s.window);
    tracing::warn!(
        node = node_name,
        taint = crate::STARTUP_TAINT,
        "startup taint left in place: {why}"
    );
    Outcome::GaveUp(why)
}

/// Returns when the watched node carries the startup taint, the watch ended, or the deadline.
async fn wait_for_taint(
    client: &Client,
    node_name: &str,
    node: &Node,
    deadline: Instant,
) -> Result<(), Error> {
    let left = deadline.saturating_duration_since(Instant::now());
    let secs = left.as_secs().clamp(1, 300);
    let path = format!(
        "/api/v1/nodes?fieldSelector=metadata.name%3D{node_name}&watch=true&resourceVersion={}&timeoutSeconds={secs}",
        node.metadata.resource_version
    );
    let mut watch = client.watch(&path).await?;
    let until = (Instant::now() + Duration::from_secs(secs + 5)).min(deadline);
    loop {
        let event = match tokio::time::timeout_at(until, watch.next()).await {
            Err(_) | Ok(Ok(None)) => return Ok(()),
            Ok(Ok(Some(ev))) => ev,
            Ok(Err(e)) => return Err(e),
        };
        if event.kind == "ERROR" {
            // Typically 410 Gone (the version is too old): read the node afresh.
            return Ok(());
        }
        match serde_json::from_value::<Node>(event.object) {
            Ok(n) if n.has_startup_taint() => return Ok(()),
            Ok(_) => {}
            Err(e) => return Err(Error::Decode(e.to_string())),
        }
    }
}
