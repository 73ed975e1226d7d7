//! Every line of the text log is one record: request-derived strings (ids, paths, contexts)
//! are escaped, so none of them can end a line, forge another, drive the terminal, or add a
//! field to its line.

use std::collections::HashMap;

use ebs_tests::csi_req::*;
use ebs_tests::*;

use super::{MIB, fs_cap};

const SECRET: &str = "hunter2-LOGSECRET";
/// A whole forged record, as the devicePath carried it.
const FORGED_LINE: &str = "1999-01-01T00:00:00.000000Z  INFO ok rpc=\"NodeForgedVolume\"";

/// Values that try every way out of their field: a newline with a forged record, a carriage
/// return, a terminal escape, quotes that close the value and add a field, a bidi override.
fn evil(tag: &str) -> Vec<String> {
    vec![
        format!("{tag}\n{FORGED_LINE} volume=\"x\""),
        format!("{tag}\r{FORGED_LINE}"),
        format!("{tag}\u{1b}[2J\u{1b}[31mred"),
        format!("{tag}\" rpc=\"NodeForgedVolume\" x=\""),
        format!("{tag} rpc=NodeForgedVolume"),
        format!("{tag}\u{202e}desrever"),
    ]
}

/// The line's tokens outside quoted strings (a quoted string, escapes and all, is one token).
fn bare_tokens(line: &str) -> Vec<String> {
    let mut tokens = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' if quoted => {
                cur.push(c);
                if let Some(n) = chars.next() {
                    cur.push(n);
                }
            }
            '"' => {
                quoted = !quoted;
                cur.push(c);
            }
            ' ' if !quoted => tokens.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    tokens.push(cur);
    tokens.retain(|t| !t.is_empty());
    tokens
}

#[tokio::test]
async fn every_text_log_line_is_one_record_whatever_the_request_holds() {
    if !require_root("every_text_log_line_is_one_record_whatever_the_request_holds") {
        return;
    }
    let scratch = Scratch::new("log-lines");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let vol = create_attached(&agent, "logs", 64 * MIB).await;
    let staging = agent.work.join("stage-logs");
    let target = agent.work.join("target-logs");
    let secrets = || HashMap::from([("password".to_string(), SECRET.to_string())]);
    let mut node = agent.node().await;
    let mut calls = 0;
    for (i, value) in evil("x").into_iter().enumerate() {
        let context = HashMap::from([
            (
                "devicePath".to_string(),
                format!("/dev/loop-gone-{i}{value}"),
            ),
            (value.clone(), value.clone()),
        ]);
        // devicePath, the contexts' keys and values, and the secrets on a real volume.
        let mut stage = stage_req(&vol, &staging, fs_cap());
        stage.publish_context = context.clone();
        stage.volume_context = context.clone();
        stage.secrets = secrets();
        let _ = node.node_stage_volume(stage.clone()).await;
        // The volume id, then the staging path.
        let mut bad_id = stage.clone();
        bad_id.volume_id = format!("lv-{value}");
        let _ = node.node_stage_volume(bad_id).await;
        let mut bad_path = stage.clone();
        bad_path.staging_target_path = format!("{}/{value}", agent.work.display());
        let _ = node.node_stage_volume(bad_path).await;
        // Publish: the target path and the contexts.
        let mut publish = publish_req(&vol, &staging, &target, fs_cap(), false);
        publish.target_path = format!("{}/t{value}", agent.work.display());
        publish.publish_context = context.clone();
        publish.volume_context = context;
        publish.secrets = secrets();
        let _ = node.node_publish_volume(publish).await;
        // Unpublish and unstage with the id and the paths.
        let _ = node
            .node_unpublish_volume(unpublish_by_id(&format!("lv-{value}"), &target))
            .await;
        let _ = node
            .node_unstage_volume(csi::NodeUnstageVolumeRequest {
                volume_id: vol.id.clone(),
                staging_target_path: format!("{}/{value}", agent.work.display()),
            })
            .await;
        calls += 6;
    }
    // The good stage, whatever the evil ones did, so the log has ok lines too.
    let _ = node.node_unstage_volume(unstage_req(&vol, &staging)).await;

    let log = agent.log_text();
    assert!(!log.contains(SECRET), "a secret in the log:\n{log}");
    assert!(!log.contains('\u{1b}'), "a raw terminal escape in the log");
    assert!(!log.contains('\r'), "a raw carriage return in the log");
    assert!(!log.contains('\u{202e}'), "a raw bidi override in the log");
    let mut rpc_lines = 0;
    for line in log.lines().filter(|l| !l.trim().is_empty()) {
        let tokens = bare_tokens(line);
        // One record per line: it starts with the agent's own timestamp and level.
        let starts = tokens.first().is_some_and(|t| {
            t.len() > 20 && t.as_bytes()[4] == b'-' && t.ends_with('Z') && !t.starts_with("1999")
        }) && tokens
            .get(1)
            .is_some_and(|l| ["TRACE", "DEBUG", "INFO", "WARN", "ERROR"].contains(&l.as_str()));
        assert!(starts, "a line that is not a record of its own: {line:?}");
        let rpcs: Vec<_> = tokens.iter().filter(|t| t.starts_with("rpc=")).collect();
        assert!(rpcs.len() <= 1, "a field added to its line: {line:?}");
        assert!(
            !rpcs.iter().any(|t| t.contains("Forged")),
            "a forged rpc field: {line:?}"
        );
        rpc_lines += rpcs.len();
    }
    // Every call has its one line (refused ones included), and no more.
    assert!(
        rpc_lines >= calls,
        "{rpc_lines} rpc lines for {calls} calls:\n{log}"
    );
}
