//! The newer syscalls the agent prefers, asked of the kernel with harmless arguments (see
//! `host::sandbox`): whether this process may use them, or whether a seccomp filter (systemd's
//! unit, a container profile) or the kernel's age sends the agent to a fallback. None of them is
//! needed: each fallback keeps every guarantee and costs only speed, so these are warnings.

use super::Check;
use ebs_node_host::sandbox::{self, Newer, Probe};

fn unavailable(call: Newer, found: Probe) -> String {
    format!(
        "{}: {}; {}",
        found.answer(),
        sandbox::why(call, found),
        call.fallback()
    )
}

fn kernel_is_old(call: Newer) -> bool {
    sandbox::kernel_version(&sandbox::kernel_release()).is_some_and(|v| v < call.since())
}

pub fn openat2() -> Check {
    const NAME: &str = "openat2";
    let found = sandbox::probe(Newer::Openat2);
    if found.usable() {
        return Check::ok(
            NAME,
            "available: a path resolves in one call, confined below its prefix \
             (RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)",
        );
    }
    let fix = if kernel_is_old(Newer::Openat2) {
        "run a kernel of 5.6 or later (the fallback is as safe)"
    } else {
        "under systemd leave RestrictSUIDSGID= off, which blocks openat2 whole (the shipped unit \
         does; docs/operations/systemd.md); the fallback is as safe"
    };
    Check::lacking(NAME, false, unavailable(Newer::Openat2, found), fix)
}

pub fn statmount() -> Check {
    const NAME: &str = "statmount/listmount";
    let found = sandbox::probe(Newer::Statmount);
    let list = sandbox::probe(Newer::Listmount);
    let listmount = if list.usable() {
        "listmount available".to_string()
    } else {
        format!("listmount {} (not used)", list.answer())
    };
    if found.usable() {
        return Check::ok(
            NAME,
            format!("statmount available: one mount's facts per call, no table read; {listmount}"),
        );
    }
    let fix = if kernel_is_old(Newer::Statmount) {
        "run a kernel of 6.8 or later for per-mount lookups"
    } else {
        "nothing needed; to get the faster path under systemd, allow them in a drop-in \
         (SystemCallFilter=statmount listmount), which works only where libseccomp knows their \
         names (2.6+; systemd ignores unknown names with a warning)"
    };
    Check::lacking(
        NAME,
        false,
        format!(
            "statmount {}; {listmount}",
            unavailable(Newer::Statmount, found)
        ),
        fix,
    )
}

pub fn seccomp() -> Check {
    const NAME: &str = "seccomp";
    match sandbox::seccomp_mode() {
        Some(0) => return Check::ok(NAME, "no seccomp filter: every syscall the kernel has"),
        Some(2) => {}
        Some(mode) => {
            return Check::lacking(NAME, false, format!("seccomp mode {mode}"), "");
        }
        None => {
            return Check::skipped(NAME, "/proc/self/status has no Seccomp: field");
        }
    }
    let filters = sandbox::seccomp_filters()
        .map(|n| format!("{n} seccomp filter(s)"))
        .unwrap_or_else(|| "a seccomp filter".into());
    let denied: Vec<String> = sandbox::ALL
        .into_iter()
        .filter_map(|call| {
            let found = sandbox::probe(call);
            (!found.usable() && !kernel_is_old(call))
                .then(|| format!("{} ({})", call.name(), found.answer()))
        })
        .collect();
    if denied.is_empty() {
        return Check::ok(
            NAME,
            format!("{filters}, which let statmount, listmount and openat2 through"),
        );
    }
    Check::lacking(
        NAME,
        false,
        format!(
            "{filters} deny {}: the agent takes the fallbacks named above",
            denied.join(", ")
        ),
        "nothing needed: the agent works the same, a little slower",
    )
}
