//! The README stays true: its quick start's blocks marked ```` ```sh runnable ```` run, in order,
//! in one shell, against a scratch agent on real loop devices, with the README's binary, socket
//! and mount prefix replaced by the test's. They must succeed, show the volume staged and
//! published, and leave nothing behind. `packaging/local/start.sh` must start the agent the
//! README's commands talk to.

use std::path::{Path, PathBuf};

use ebs_tests::*;

/// The checkout line (start.sh prints the real one), and the binary below it.
const README_CHECKOUT: &str = "R=~/ebs-node-agent";
const README_BIN: &str = "$R/target/release/ebs-node-agent";
const README_ENDPOINT: &str = "unix:///run/ebs-node-agent/csi.sock";
const README_MOUNTS: &str = "/mnt/ebs-node-agent";

fn repo_file(rel: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The bodies of the fenced blocks whose info string is `sh runnable`, in order.
fn runnable_blocks(markdown: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<Vec<&str>> = None;
    for line in markdown.lines() {
        match current.as_mut() {
            None if line.trim() == "```sh runnable" => current = Some(Vec::new()),
            None => {}
            Some(body) if line.trim() == "```" => {
                blocks.push(body.join("\n"));
                current = None;
            }
            Some(body) => body.push(line),
        }
    }
    assert!(current.is_none(), "an unclosed runnable block");
    blocks
}

/// Every path below `dir`, relative, sorted.
fn entries(dir: &Path) -> Vec<PathBuf> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = e.path();
            out.push(path.strip_prefix(root).unwrap_or(&path).to_path_buf());
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                walk(root, &path, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

#[test]
fn runnable_blocks_are_found_in_order() {
    let md = "text\n```sh runnable\na\nb\n```\n```sh\nnot this\n```\n```sh runnable\nc\n```\n";
    assert_eq!(
        runnable_blocks(md),
        vec!["a\nb".to_string(), "c".to_string()]
    );
}

#[test]
fn start_sh_serves_what_the_readme_calls() {
    let start = repo_file("packaging/local/start.sh");
    assert!(start.contains(README_ENDPOINT), "start.sh's socket");
    assert!(
        start.contains(&format!("EBS_AGENT_MOUNTS:-{README_MOUNTS}"))
            && start.contains("--allowed-path-prefix \"$mounts\""),
        "start.sh allows the README's mount prefix"
    );
    assert!(start.contains("--backend loop"));
    let readme = repo_file("README.md");
    assert!(readme.contains("./packaging/local/start.sh"));
    assert!(
        readme.lines().count() <= 260,
        "README.md is a guide: the record lives in docs/"
    );
}

#[tokio::test]
async fn the_quick_start_runs_and_leaves_the_host_clean() {
    if !require_root("the_quick_start_runs_and_leaves_the_host_clean") {
        return;
    }
    let blocks = runnable_blocks(&repo_file("README.md"));
    assert!(blocks.len() >= 2, "the lifecycle and its teardown");
    let scratch = Scratch::new("readme");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let work_before = entries(&agent.work);
    let bin: PathBuf = agent_bin();
    let script = blocks.join("\n");
    assert!(
        script.contains(README_CHECKOUT) && script.contains(README_BIN),
        "the blocks say where the checkout is and name the binary below it:\n{script}"
    );
    let script = script
        .replace(README_CHECKOUT, "R=/nonexistent")
        .replace(README_BIN, bin.to_str().unwrap())
        .replace(README_ENDPOINT, &agent.endpoint())
        .replace(README_MOUNTS, agent.work.to_str().unwrap());
    assert!(
        !script.contains("/run/ebs-node-agent") && !script.contains("/var/lib/ebs-node-agent"),
        "the blocks name only what the test replaces:\n{script}"
    );
    // From a directory that is not the checkout: the blocks must not depend on where they run.
    let elsewhere = scratch.join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let out = std::process::Command::new("bash")
        .args(["-euo", "pipefail", "-c", &script])
        .current_dir(&elsewhere)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the quick start failed:\n{script}\nstdout:\n{stdout}\nstderr:\n{}\nagent log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        agent.log_text()
    );
    assert!(
        stdout.contains("state         staged and published"),
        "{stdout}"
    );

    // Nothing left: no mounts, no loop devices, no volumes, no directories.
    assert!(mounts_below(&agent.work).is_empty(), "mounts left");
    assert_eq!(
        entries(&agent.work),
        work_before,
        "files or directories left below the mount prefix"
    );
    assert!(
        loops_below(&agent.state_dir).is_empty(),
        "loop devices left"
    );
    let (ok, list) = agent.client_json(&["controller", "list-volumes"]);
    assert!(ok);
    assert_eq!(
        list["entries"],
        serde_json::json!([]),
        "volumes left: {list}"
    );
    let status = agent.status_json();
    assert_eq!(status["volumes"], serde_json::json!([]), "{status}");
}
