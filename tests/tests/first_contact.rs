//! What a newcomer's first run of the test command depends on (docs/first-contact.md): a pinned
//! toolchain, no loop a newer toolchain's lints refuse, no path of one machine, a closing summary
//! whose counts match its FAILED lines, and a Kubernetes tier that reports its scenarios when it
//! cannot run them.

use std::path::{Path, PathBuf};
use std::process::Command;

use ebs_tests::k8s::repo_root;

/// The project's tracked files (git ls-files), as paths under the repository root.
fn tracked() -> Vec<PathBuf> {
    let out = Command::new("git")
        .arg("-C")
        .arg(repo_root())
        .args(["ls-files", "-z"])
        .output()
        .expect("git ls-files");
    assert!(out.status.success(), "git ls-files: {out:?}");
    out.stdout
        .split(|b| *b == 0)
        .filter(|p| !p.is_empty())
        .map(|p| repo_root().join(String::from_utf8_lossy(p).as_ref()))
        .collect()
}

/// `for PAT in EXPR {` where EXPR, without its parentheses, is a range with no end (`0..`).
fn unbounded_for(line: &str) -> bool {
    let Some(rest) = line.trim_start().strip_prefix("for ") else {
        return false;
    };
    let Some((_, expr)) = rest.split_once(" in ") else {
        return false;
    };
    let Some(expr) = expr.trim_end().strip_suffix('{') else {
        return false;
    };
    let expr = expr.trim();
    let expr = expr
        .strip_prefix('(')
        .and_then(|e| e.strip_suffix(')'))
        .unwrap_or(expr)
        .trim();
    expr.ends_with("..") && !expr.contains([' ', '(', '['])
}

#[test]
fn no_unbounded_range_loop_a_newer_clippy_refuses() {
    assert!(unbounded_for("        for n in 0.. {"));
    assert!(unbounded_for("for x in (start..) {"));
    assert!(!unbounded_for("for t in 0..4u64 {"));
    assert!(!unbounded_for("for (i, _) in queue.drain(..) {"));
    let mut found = Vec::new();
    for file in tracked() {
        if file.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        for (n, line) in text.lines().enumerate() {
            if unbounded_for(line) {
                found.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "for loops over an unbounded range (clippy's for_unbounded_range on newer toolchains): \
         write `loop` with a counter\n{}",
        found.join("\n")
    );
}

/// "/work/" as the start of an absolute path (not `$dir/work/...`).
fn machine_path(line: &str) -> bool {
    line.match_indices("/work/").any(|(i, _)| {
        i == 0
            || line[..i]
                .chars()
                .last()
                .is_some_and(|c| " \t\"'`(=:,[".contains(c))
    })
}

#[test]
fn no_machine_specific_path_in_the_project() {
    assert!(machine_path("  [[ -f /work/shared/tools/k8s/kubelet.xz ]]"));
    assert!(machine_path("PathBuf::from(\"/work/shared/tools/k8s\")"));
    assert!(!machine_path("--work-dir \"$scratch/work/bench\""));
    let mut found = Vec::new();
    for file in tracked() {
        // This file names the pattern it looks for.
        if file.ends_with("tests/tests/first_contact.rs") {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue; // not text
        };
        for (n, line) in text.lines().enumerate() {
            if machine_path(line) {
                found.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "absolute paths of one machine (look things up relative to the checkout, or take an \
         environment variable):\n{}",
        found.join("\n")
    );
}

/// `key = "value"` of a TOML file, the first such line.
fn toml_value(text: &str, key: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once('=')?;
        let v = v.split('#').next().unwrap_or_default();
        (k.trim() == key).then(|| v.trim().trim_matches('"').to_string())
    })
}

fn version(v: &str) -> Vec<u32> {
    v.split('.')
        .map(|p| p.parse().unwrap_or(u32::MAX))
        .collect()
}

#[test]
fn the_toolchain_is_pinned_and_every_crate_states_its_oldest_rust() {
    let root = repo_root();
    let pin = std::fs::read_to_string(root.join("rust-toolchain.toml"))
        .expect("rust-toolchain.toml: the toolchain CI runs");
    let channel = toml_value(&pin, "channel").expect("rust-toolchain.toml: channel");
    assert_eq!(
        version(&channel).len(),
        3,
        "the pin is an exact release (x.y.z), not {channel:?}: a moving channel brings new lints"
    );
    let workspace = std::fs::read_to_string(root.join("Cargo.toml")).expect("Cargo.toml");
    let msrv = toml_value(&workspace, "rust-version").expect("workspace rust-version");
    assert!(
        version(&msrv) <= version(&channel),
        "rust-version {msrv} is newer than the pinned {channel}"
    );
    // The workspace's value binds nothing unless each member inherits it.
    let members = workspace
        .lines()
        .find(|l| l.starts_with("members"))
        .expect("members");
    for m in members.split('"').skip(1).step_by(2) {
        let manifest = std::fs::read_to_string(root.join(m).join("Cargo.toml")).expect(m);
        assert!(
            manifest
                .lines()
                .any(|l| l.trim() == "rust-version.workspace = true"),
            "{m}/Cargo.toml does not inherit the workspace's rust-version"
        );
    }
}

/// A cargo test log with one failed test, one binary that ended before its harness, one that
/// passed with a skipped test; and a failed step.
const LOG: &str = "\
     Running tests/crash.rs (target/debug/deps/crash-1)
thread 'main' panicked at tests/crash.rs:1:12:
error: test failed, to rerun pass `-p ebs-tests --test crash`
     Running tests/fails.rs (target/debug/deps/fails-2)
running 2 tests
test bad ... FAILED
test ok ... ok
test result: FAILED. 1 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.6s
error: test failed, to rerun pass `-p ebs-tests --test fails`
     Running tests/good.rs (target/debug/deps/good-3)
running 3 tests
test result: ok. 3 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.0s
error: 2 targets failed:
    `-p ebs-tests --test crash`
    `-p ebs-tests --test fails`
";

#[test]
fn the_summary_counts_what_it_lists() {
    let dir = std::env::temp_dir().join(format!("ebs-summary-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let _clean = Remove(dir.clone());
    let (log, skips) = (dir.join("log"), dir.join("skips"));
    std::fs::write(&log, LOG).expect("log");
    std::fs::write(
        &skips,
        "SKIPPED: good::a: needs root\nSKIPPED: good::b: needs root\n",
    )
    .expect("skips");
    let out = Command::new("bash")
        .arg(repo_root().join("tests/summary.sh"))
        .args([&log, &skips])
        .args(["101", "cargo clippy -D warnings"])
        .output()
        .expect("tests/summary.sh");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{text}");
    let failed: Vec<&str> = text.lines().filter(|l| l.starts_with("FAILED: ")).collect();
    assert_eq!(failed.len(), 3, "{text}");
    assert!(
        failed
            .iter()
            .any(|l| l.contains("--test crash") && l.contains("no `test result` line")),
        "{text}"
    );
    assert!(
        failed
            .iter()
            .any(|l| l.contains("--test fails") && l.contains("1 test failed")),
        "{text}"
    );
    assert!(
        text.contains("SKIPPED: good::a, good::b (2 tests): needs root"),
        "{text}"
    );
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[lines.len().saturating_sub(2)..],
        [
            "3 FAILED lines (1 step, 2 test binaries)",
            "tests: 2 passed, 1 failed, 2 skipped"
        ],
        "{text}"
    );
}

struct Remove(PathBuf);

impl Drop for Remove {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The Kubernetes tier's binary beside this one (cargo builds every test binary of the package
/// before it runs any): the newest `kubernetes-<hash>`.
fn kubernetes_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe.parent().expect("deps directory");
    std::fs::read_dir(deps)
        .expect("deps directory")
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().unwrap_or_default().to_string_lossy();
            name.starts_with("kubernetes-") && p.extension().is_none()
        })
        .max_by_key(|p| p.metadata().and_then(|m| m.modified()).ok())
        .expect("the kubernetes test binary: cargo test -p ebs-tests --no-run --test kubernetes")
}

fn run_tier_without_tools(ci: bool, skips: &Path) -> (bool, String) {
    let mut cmd = Command::new(kubernetes_binary());
    cmd.env("K8S_TOOLS", "/nonexistent/k8s-tools")
        .env("EBS_SKIP_LOG", skips)
        .env_remove("CI");
    if ci {
        cmd.env("CI", "true");
    }
    let out = cmd.output().expect("run the kubernetes tier");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

#[test]
fn the_kubernetes_tier_reports_each_scenario_it_cannot_run() {
    let dir = std::env::temp_dir().join(format!("ebs-k8s-skip-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let _clean = Remove(dir.clone());
    let skips = dir.join("skips");
    let (ok, text) = run_tier_without_tools(false, &skips);
    assert!(ok, "{text}");
    let result = text
        .lines()
        .find(|l| l.starts_with("test result: ok. "))
        .unwrap_or_else(|| panic!("no `test result` line:\n{text}"));
    let n: usize = result
        .split_whitespace()
        .nth(3)
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(n > 10, "{result}");
    let logged = std::fs::read_to_string(&skips).unwrap_or_default();
    assert_eq!(logged.lines().count(), n, "one skip a scenario:\n{logged}");
    assert!(
        logged
            .lines()
            .all(|l| l.starts_with("SKIPPED: kubernetes::k8s_") && l.contains(": ")),
        "{logged}"
    );

    // Under CI=true the same run fails, each scenario counted as failed, and skips nothing.
    std::fs::remove_file(&skips).ok();
    let (ok, text) = run_tier_without_tools(true, &skips);
    assert!(!ok, "{text}");
    assert!(
        text.contains(&format!("test result: FAILED. 0 passed; {n} failed")),
        "{text}"
    );
    assert!(!skips.exists(), "a skip under CI=true");
}
