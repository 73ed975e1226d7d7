//! The layout everyone shares (issue 50, "one name, one path"): crates side by side, none inside
//! another crate's folder, every crate of the agent directly under `agent/`, and the README's
//! crate map naming each of them. A crate found anywhere else is a crate nobody put on the map.

use std::path::{Path, PathBuf};

use super::manifests::{read, repo};

/// The folder of every crate in the repository: each `Cargo.toml` with a `[package]`, found by a
/// walk that skips build output and version control.
fn crate_folders() -> Vec<PathBuf> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let path = e.path();
            let name = e.file_name();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                if name != "target" && name != ".git" && name != "corpus" && name != "artifacts" {
                    walk(root, &path, out);
                }
            } else if name == "Cargo.toml"
                && std::fs::read_to_string(&path).is_ok_and(|t| t.contains("[package]"))
            {
                let folder = path.parent().unwrap_or(root);
                out.push(folder.strip_prefix(root).unwrap_or(folder).to_path_buf());
            }
        }
    }
    let root = repo().canonicalize().expect("repo");
    let mut out = Vec::new();
    walk(&root, &root, &mut out);
    out.sort();
    out
}

#[test]
fn crates_lie_side_by_side_and_the_readme_maps_them() {
    let crates = crate_folders();
    assert!(crates.len() >= 9, "{crates:?}");
    for a in &crates {
        for b in &crates {
            assert!(
                a == b || !b.starts_with(a),
                "crate {} lies inside crate {}'s folder",
                b.display(),
                a.display()
            );
        }
        // The agent's crates live in `agent/<name>`; the shared ones at the top.
        let depth = a.components().count();
        let top = ["proto", "store", "tests", "fuzz"].map(Path::new);
        assert!(
            top.contains(&a.as_path()) || (a.starts_with("agent") && depth == 2),
            "crate {} is neither at the top nor directly under agent/",
            a.display()
        );
    }
    let readme = read("README.md");
    let map = readme
        .split("**The code**")
        .nth(1)
        .expect("README.md has a crate map (\"**The code**\")");
    for c in &crates {
        let name = format!("`{}`", c.display());
        assert!(map.contains(&name), "the README's crate map lacks {name}");
    }
    // The workspace names every crate but the fuzz targets' own workspace.
    let workspace = read("Cargo.toml");
    for c in crates.iter().filter(|c| c.as_path() != Path::new("fuzz")) {
        let member = format!("\"{}\"", c.display());
        assert!(
            workspace.contains(&member),
            "workspace members lack {member}"
        );
    }
}

/// Every `.rs` file below `dir`, relative to the repository.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = e.path();
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
}

/// The seam is typed (issue 50): a handle carries its own host calls, so shipped code never
/// takes one apart again. Test code (a `tests` folder or file, or below `#[cfg(test)]`) may.
#[test]
fn shipped_code_never_downcasts() {
    let mut files = Vec::new();
    for dir in ["agent", "store", "proto"] {
        rust_files(&repo().join(dir), &mut files);
    }
    assert!(files.len() > 100, "{}", files.len());
    for f in files {
        let rel = f.strip_prefix(repo()).unwrap_or(&f).display().to_string();
        let is_test = rel.contains("/tests/") || rel.ends_with("tests.rs");
        if is_test {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        let shipped = text.split("#[cfg(test)]").next().unwrap_or_default();
        for (n, line) in shipped.lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            assert!(
                !code.contains("downcast") && !code.contains("as_any"),
                "{rel}:{}: {line}",
                n + 1
            );
        }
    }
}

/// One name, one path (issue 50): no crate re-exports another crate's module or item, so each
/// has the one name of the crate that defines it.
#[test]
fn no_crate_gives_another_crates_items_a_second_name() {
    let mut files = Vec::new();
    for dir in ["agent", "store", "proto"] {
        rust_files(&repo().join(dir), &mut files);
    }
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim_start();
            assert!(
                !(line.starts_with("pub use ebs_") || line.starts_with("pub use crate::")),
                "{}:{}: {line}",
                f.strip_prefix(repo()).unwrap_or(&f).display(),
                n + 1
            );
        }
    }
}
