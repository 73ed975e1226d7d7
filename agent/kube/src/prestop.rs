//! The pre-stop hook (`ebs-node-agent pre-stop`, upstream's `pre-stop-hook`): when the node is
//! being drained (or is gone), keep the pod, and so the agent serving NodeUnstage, until no
//! VolumeAttachment of this node and driver remains, at most for the given time. A pod stopped
//! for any other reason (a rolling update of the agent) returns at once: its volumes stay.

use std::time::Duration;

use tokio::time::Instant;

use crate::client::{Client, Error};
use crate::objects::{Node, VolumeAttachment, VolumeAttachmentList};

#[derive(Clone, Debug)]
pub struct Settings {
    pub driver: String,
    /// Less than the pod's termination grace period, leaving the agent its shutdown grace.
    pub timeout: Duration,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Not draining: nothing to wait for.
    NotDraining,
    /// Every VolumeAttachment of the node is gone.
    Detached { waited: Duration },
    /// The time ran out with this many left.
    TimedOut { left: usize },
}

const VA_PATH: &str = "/apis/storage.k8s.io/v1/volumeattachments";

pub async fn pre_stop(client: &Client, node_name: &str, s: &Settings) -> Result<Outcome, Error> {
    let started = Instant::now();
    let deadline = started + s.timeout;
    let node = tokio::time::timeout_at(
        deadline,
        client.get::<Node>(&format!("/api/v1/nodes/{node_name}")),
    )
    .await
    .map_err(|_| Error::Timeout(s.timeout))??;
    match node {
        Some(n) if !n.is_being_drained() => {
            tracing::info!(
                node = node_name,
                "pre-stop: the node is not being drained; nothing to wait for"
            );
            return Ok(Outcome::NotDraining);
        }
        Some(_) => tracing::info!(
            node = node_name,
            "pre-stop: the node is being drained; waiting for its volumes to detach"
        ),
        None => tracing::info!(
            node = node_name,
            "pre-stop: the node object is gone (terminating); waiting for its volumes to detach"
        ),
    }
    let mut left = usize::MAX;
    let mut pause = Duration::from_millis(500);
    let mut reported = None;
    loop {
        let round = async {
            let list: VolumeAttachmentList = client
                .get(VA_PATH)
                .await?
                .ok_or_else(|| Error::Decode("no VolumeAttachment API".into()))?;
            let ours: Vec<&VolumeAttachment> = list
                .items
                .iter()
                .filter(|va| va.is_of(node_name, &s.driver))
                .collect();
            if ours.is_empty() {
                return Ok::<_, Error>(0);
            }
            if reported != Some(ours.len()) {
                let names: Vec<&str> = ours.iter().map(|v| v.metadata.name.as_str()).collect();
                tracing::info!(node = node_name, remaining = ours.len(), attachments = ?names, "pre-stop: waiting");
                reported = Some(ours.len());
            }
            let n = ours.len();
            wait_for_change(
                client,
                node_name,
                &s.driver,
                &list.metadata.resource_version,
                deadline,
            )
            .await?;
            Ok(n)
        };
        match tokio::time::timeout_at(deadline, round).await {
            Err(_) => {
                tracing::warn!(node = node_name, remaining = left, timeout = ?s.timeout, "pre-stop: time is up with volumes still attached");
                return Ok(Outcome::TimedOut { left });
            }
            Ok(Ok(0)) => {
                let waited = started.elapsed();
                tracing::info!(
                    node = node_name,
                    ?waited,
                    "pre-stop: no VolumeAttachment of this node remains"
                );
                return Ok(Outcome::Detached { waited });
            }
            Ok(Ok(n)) => {
                left = n;
                pause = Duration::from_millis(500);
            }
            Ok(Err(e)) => {
                // Draining is when the API server is busiest: retry until the time is up.
                tracing::warn!(error = %e, "pre-stop: listing VolumeAttachments failed; retrying");
                tokio::time::sleep_until((Instant::now() + pause).min(deadline)).await;
                pause = (pause * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// Returns when a VolumeAttachment of this node and driver changed (or the watch ended).
async fn wait_for_change(
    client: &Client,
    node_name: &str,
    driver: &str,
    resource_version: &str,
    deadline: Instant,
) -> Result<(), Error> {
    let secs = deadline
        .saturating_duration_since(Instant::now())
        .as_secs()
        .clamp(1, 300);
    let mut watch = client
        .watch(&format!(
            "{VA_PATH}?watch=true&resourceVersion={resource_version}&timeoutSeconds={secs}"
        ))
        .await?;
    loop {
        let Some(event) = watch.next().await? else {
            return Ok(());
        };
        if event.kind == "ERROR" {
            return Ok(());
        }
        let va: VolumeAttachment =
            serde_json::from_value(event.object).map_err(|e| Error::Decode(e.to_string()))?;
        if va.is_of(node_name, driver) {
            return Ok(());
        }
    }
}
