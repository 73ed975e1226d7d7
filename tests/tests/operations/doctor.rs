//! `ebs-node-agent doctor`: one line per check, failing only for what the backend needs.

use std::process::Command;

use ebs_tests::*;

use super::unit_caps::has_effective_cap;

/// `doctor` prints one line per check with its fix, names a missing CAP_SYS_RESOURCE (which only
/// online ext4 growth needs) without failing the loop backend, and fails when something the
/// backend needs is missing (here: a state directory that cannot be created).
#[test]
fn doctor_names_what_is_missing_and_fails_only_for_what_is_needed() {
    if !require_root("doctor_names_what_is_missing_and_fails_only_for_what_is_needed") {
        return;
    }
    let scratch = Scratch::new("doctor");
    let doctor = |state_dir: &std::path::Path| {
        let out = Command::new(agent_bin())
            .args(["doctor", "--backend", "loop", "--skip-imds", "--endpoint"])
            .arg(format!("unix://{}", scratch.join("run/csi.sock").display()))
            .arg("--state-dir")
            .arg(state_dir)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (code, text) = doctor(&scratch.join("state"));
    assert_eq!(code, Some(0), "{text}");
    const CAP_SYS_RESOURCE: u32 = 24;
    let resource = line_of(&text, "CAP_SYS_RESOURCE");
    if has_effective_cap(CAP_SYS_RESOURCE) {
        assert!(resource.starts_with("ok "), "{resource}");
    } else {
        assert!(
            resource.starts_with("warning ")
                && resource.contains("missing")
                && resource.contains("Fix:"),
            "{resource}"
        );
    }
    assert!(line_of(&text, "CAP_SYS_ADMIN").starts_with("ok "));
    for name in [
        "ext4", "loop", "openat2", "socket", "state", "udev", "instance",
    ] {
        line_of(&text, name);
    }
    assert!(text.contains("ready for --backend loop"), "{text}");
    assert!(!scratch.join("state").exists(), "doctor creates nothing");

    let (code, text) = doctor(&unwritable_dir(&scratch));
    assert_eq!(code, Some(1), "{text}");
    let state = line_of(&text, "state");
    assert!(
        state.starts_with("MISSING ") && state.contains("not a directory"),
        "{state}"
    );
}

fn line_of(text: &str, name: &str) -> String {
    text.lines()
        .find(|l| l.split_whitespace().nth(1) == Some(name))
        .unwrap_or_else(|| panic!("no {name} line in:\n{text}"))
        .to_string()
}
