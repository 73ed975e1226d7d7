//! csi-sanity, the CSI community's conformance suite (kubernetes-csi/csi-test), in mount mode
//! and in block mode against `serve --backend loop --mode all`: every spec must pass or be
//! skipped for a capability the plugin does not advertise, and at least 75 must pass per mode.
//! The binary is found by `tests/tools.sh` (`$CSI_SANITY`, then `shared/tools/csi-sanity` beside
//! the checkout or above it, then what `tests/run.sh` built into `target/tools/`); outside CI the
//! test skips when it is absent (listed as SKIPPED in run.sh's summary), under CI=true it fails at
//! once, saying how to provide it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ebs_tests::tools::tool;
use ebs_tests::*;

const MIN_PASSED: usize = 75;
/// The node's attach limit for the run, so the attach-limit spec runs (it attaches this many
/// volumes and expects one more to be refused).
const ATTACH_LIMIT: &str = "4";

fn sanity_binary(test: &str) -> Option<PathBuf> {
    match tool("csi-sanity") {
        Ok(bin) => Some(bin),
        Err(what_to_do) if is_ci() => {
            panic!("{test}: CI=true: refusing to skip.\n{what_to_do}")
        }
        Err(what_to_do) => {
            let one_line: Vec<&str> = what_to_do.split_whitespace().collect();
            skip(test, &one_line.join(" "));
            None
        }
    }
}

#[derive(Debug, Default)]
struct Counts {
    passed: usize,
    failed: Vec<String>,
    skipped: usize,
    other: usize,
}

/// Counts the `It` specs of a ginkgo JSON report by state.
fn count(report: &Path) -> Counts {
    let text = std::fs::read_to_string(report).expect("csi-sanity wrote no JSON report");
    let suites: serde_json::Value = serde_json::from_str(&text).expect("JSON report");
    let mut c = Counts::default();
    for suite in suites.as_array().expect("a list of suites") {
        for spec in suite["SpecReports"].as_array().into_iter().flatten() {
            if spec["LeafNodeType"] != "It" {
                continue;
            }
            match spec["State"].as_str().unwrap_or("") {
                "passed" => c.passed += 1,
                "skipped" | "pending" => c.skipped += 1,
                "failed" | "panicked" | "interrupted" | "aborted" | "timedout" => {
                    let hierarchy = spec["ContainerHierarchyTexts"]
                        .as_array()
                        .map(|a| {
                            a.iter()
                                .filter_map(|t| t.as_str())
                                .collect::<Vec<_>>()
                                .join(" / ")
                        })
                        .unwrap_or_default();
                    c.failed
                        .push(format!("{hierarchy} :: {}", spec["LeafNodeText"]));
                }
                _ => c.other += 1,
            }
        }
    }
    c
}

fn run_mode(bin: &Path, agent: &Agent, scratch: &Scratch, mode: &str) -> (Counts, Duration) {
    let report = scratch.join(&format!("sanity-{mode}.json"));
    let log = scratch.join(&format!("sanity-{mode}.log"));
    let out = std::fs::File::create(&log).expect("log file");
    // csi-sanity makes the two directories, not their parent.
    std::fs::create_dir_all(agent.work.join(format!("sanity-{mode}"))).expect("work dir");
    let started = Instant::now();
    let mut child = Command::new(bin)
        .arg(format!("--csi.endpoint={}", agent.endpoint()))
        // Under the agent's allowed prefix (its work dir), apart from its state directory;
        // csi-sanity creates and removes them itself.
        .arg(format!(
            "--csi.mountdir={}",
            agent.work.join(format!("sanity-{mode}/mount")).display()
        ))
        .arg(format!(
            "--csi.stagingdir={}",
            agent.work.join(format!("sanity-{mode}/staging")).display()
        ))
        .arg(format!("--csi.testvolumesize={}", 16 << 20))
        .arg(format!("--csi.testvolumeexpandsize={}", 32 << 20))
        .arg(format!("--csi.testvolumeaccesstype={mode}"))
        .arg("--csi.testnodevolumeattachlimit")
        .arg(format!("--ginkgo.json-report={}", report.display()))
        .arg("--ginkgo.no-color")
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("log"))
        .stderr(out)
        .spawn()
        .expect("start csi-sanity");
    let deadline = started + Duration::from_secs(300);
    loop {
        if child.try_wait().expect("csi-sanity status").is_some() {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "csi-sanity {mode} ran over 300 s; its log:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let elapsed = started.elapsed();
    (count(&report), elapsed)
}

#[tokio::test(flavor = "multi_thread")]
async fn csi_sanity_passes_in_mount_and_block_mode() {
    let test = "csi_sanity_passes_in_mount_and_block_mode";
    if !require_root(test) {
        return;
    }
    let Some(bin) = sanity_binary(test) else {
        return;
    };
    let scratch = Scratch::new("csi-sanity");
    let mut opts = AgentOpts::default();
    opts.args
        .extend(["--mode", "all", "--volume-attach-limit", ATTACH_LIMIT].map(String::from));
    let agent = Agent::start(&scratch, opts).await;
    for mode in ["mount", "block"] {
        let (c, took) = {
            let (bin, agent, scratch) = (&bin, &agent, &scratch);
            tokio::task::block_in_place(|| run_mode(bin, agent, scratch, mode))
        };
        println!(
            "csi-sanity {mode}: {} passed, {} failed, {} skipped ({:.1} s)",
            c.passed,
            c.failed.len(),
            c.skipped,
            took.as_secs_f64()
        );
        assert!(
            c.failed.is_empty(),
            "csi-sanity {mode}: failed specs:\n{}\nits log: {}\nagent log:\n{}",
            c.failed.join("\n"),
            scratch.join(&format!("sanity-{mode}.log")).display(),
            agent.log_text()
        );
        assert!(
            c.passed >= MIN_PASSED,
            "csi-sanity {mode}: only {} specs passed (want at least {MIN_PASSED}): {c:?}",
            c.passed
        );
        // Every volume and snapshot the suite made was deleted through the agent.
        for dir in ["volumes", "snapshots"] {
            let left: Vec<_> = std::fs::read_dir(agent.state_dir.join(dir))
                .map(|d| d.flatten().map(|e| e.file_name()).collect())
                .unwrap_or_default();
            assert!(left.is_empty(), "{mode}: files left in {dir}: {left:?}");
        }
    }
}

/// Where csi-sanity can be neither found nor built (no `../shared`, no Go proxy), the lookup
/// fails at once and says why and what to do, in words that fit the case: GOPROXY=off is not
/// "a proxy that did not answer". tools.sh runs from a copy in a directory with no shared/
/// above it, so the real `../shared` of this checkout is not found.
#[test]
fn without_shared_or_go_proxy_csi_sanity_says_what_to_do() {
    let scratch = Scratch::new("tools-missing");
    let repo = scratch.join("checkout");
    std::fs::create_dir_all(repo.join("tests")).expect("mkdir");
    let tools = concat!(env!("CARGO_MANIFEST_DIR"), "/tools.sh");
    std::fs::copy(tools, repo.join("tests/tools.sh")).expect("copy tools.sh");
    let mut runs = Vec::new();
    for (goproxy, why) in [
        ("off", "GOPROXY=off"),
        ("http://127.0.0.1:9", "did not answer"),
    ] {
        let out = Command::new("bash")
            .arg(repo.join("tests/tools.sh"))
            .args(["provide", "csi-sanity"])
            .env_remove("CSI_SANITY")
            .env_remove("CARGO_TARGET_DIR")
            .env("GOPROXY", goproxy)
            .stdin(Stdio::null())
            .output();
        runs.push((goproxy, why, out));
    }
    cleanup_dir(&scratch.path);
    for (goproxy, why, out) in runs {
        let out = out.expect("run tools.sh");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "GOPROXY={goproxy}: found a csi-sanity: {err}"
        );
        for want in [
            why,
            "CSI_SANITY=/path/to/csi-sanity",
            "shared/tools/csi-sanity",
            "go install",
        ] {
            assert!(
                err.contains(want),
                "GOPROXY={goproxy}: no {want:?} in:\n{err}"
            );
        }
    }
}
