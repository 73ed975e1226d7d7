//! Release builds never carry the test hooks (`--crash-after`, `--bench-lazy-journal`: either
//! removes crash safety). The hooks are a cargo feature, `test-hooks`; what is checked here is
//! every place that builds the agent: the image and the quick start build releases without it,
//! the test suite builds with it, and no manifest of the workspace turns it on by default. The
//! release configuration itself (no such flags, listed or accepted) is the agent's own unit
//! test `test_hooks::tests`, which tests/run.sh runs without the feature.

use super::manifests::{read, repo};

/// Every `cargo build` or `cargo install` command line in a shipped script or Dockerfile.
fn cargo_builds() -> Vec<(String, String)> {
    let mut files = vec![
        "packaging/container/Dockerfile".to_string(),
        "packaging/local/start.sh".to_string(),
        "tests/bench.sh".to_string(),
        "tests/run.sh".to_string(),
        ".ci/run".to_string(),
    ];
    for dir in ["packaging", "systemd", "tests/nvme-lab"] {
        files.extend(scripts_below(dir));
    }
    files.sort();
    files.dedup();
    let mut out = Vec::new();
    for f in files {
        let text = read(&f);
        // Continuation lines belong to their command.
        for cmd in text.replace("\\\n", " ").lines() {
            if cmd.contains("cargo build") || cmd.contains("cargo install") {
                out.push((f.clone(), cmd.trim().to_string()));
            }
        }
    }
    out
}

fn scripts_below(dir: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![repo().join(dir)];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else if p.extension().is_some_and(|x| x == "sh")
                || p.file_name().is_some_and(|n| n == "Dockerfile")
            {
                let rel = p.strip_prefix(repo()).unwrap_or(&p);
                out.push(rel.to_string_lossy().into_owned());
            }
        }
    }
    out
}

#[test]
fn release_builds_never_enable_the_test_hooks() {
    let builds = cargo_builds();
    let releases: Vec<_> = builds
        .iter()
        .filter(|(_, cmd)| cmd.contains("--release"))
        .collect();
    assert!(releases.len() >= 3, "image, quick start, bench: {builds:?}");
    for (file, cmd) in &releases {
        assert!(
            !cmd.contains("test-hooks") && !cmd.contains("--all-features"),
            "{file}: a release build with the test hooks: {cmd}"
        );
    }
    // The suite's own build has them (the crash matrix needs --crash-after).
    let run = read("tests/run.sh");
    assert!(
        run.contains("--features ebs-node-agent/test-hooks"),
        "{run}"
    );
    // No manifest turns the feature on by itself (a default, or another crate's dependency).
    for manifest in [
        "Cargo.toml",
        "agent/daemon/Cargo.toml",
        "store/Cargo.toml",
        "proto/Cargo.toml",
    ] {
        let text = read(manifest);
        for line in text.lines().filter(|l| l.contains("test-hooks")) {
            let line = line.trim();
            // A comment, or the feature's own definition: nothing else may name it.
            assert!(
                line.starts_with('#') || line.starts_with("test-hooks = ["),
                "{manifest}: {line}"
            );
        }
    }
}
