//! A seccomp filter installed before the agent is exec'd (Debian's python3-seccomp, installed by
//! tests/deps.sh): how the tests reproduce what systemd's `SystemCallFilter=` and
//! `RestrictSUIDSGID=` answer, without systemd.

use std::ffi::OsString;
use std::process::Command;

/// x86_64 and the generic table (aarch64) agree on these.
pub const STATMOUNT: u32 = 457;
pub const LISTMOUNT: u32 = 458;
pub const OPENAT2: u32 = 437;
pub const CLONE3: u32 = 435;
pub const OPEN_TREE: u32 = 428;
pub const MOVE_MOUNT: u32 = 429;
pub const MOUNT_SETATTR: u32 = 442;
pub const EPERM: u32 = 1;
pub const ENOSYS: u32 = 38;

/// ioctl's number on this architecture (x86_64 16, aarch64 29).
pub const IOCTL: u32 = libc::SYS_ioctl as u32;
/// The requests that walk the kernel's list of mount namespaces (Linux 6.12); a kernel before it
/// answers them ENOTTY.
pub const NS_MNT_GET_NEXT: u64 = 0x8010_b70b;
pub const NS_MNT_GET_PREV: u64 = 0x8010_b70c;
pub const ENOTTY: u32 = 25;

/// Loads a filter that allows everything but the `nr=errno` pairs in argv[1] (`nr:arg=errno`:
/// only where the call's second argument, an ioctl's request, is `arg`), then execs the rest of
/// argv. Numbers, not names: libseccomp before 2.6 does not know statmount's.
const INSTALL_FILTER: &str = "\
import os, sys, seccomp
f = seccomp.SyscallFilter(seccomp.ALLOW)
for pair in sys.argv[1].split(','):
    call, errno = pair.split('=')
    nr, _, arg = call.partition(':')
    if arg:
        f.add_rule(seccomp.ERRNO(int(errno)), int(nr), seccomp.Arg(1, seccomp.EQ, int(arg)))
    else:
        f.add_rule(seccomp.ERRNO(int(errno)), int(nr))
f.load()
os.execv(sys.argv[2], sys.argv[2:])
";

/// The command that runs what follows it under the filter.
pub fn filtered(rules: &[(u32, u32)]) -> Vec<OsString> {
    let rules: Vec<String> = rules.iter().map(|(nr, e)| format!("{nr}={e}")).collect();
    install(&rules)
}

/// As a kernel before 6.12: the requests that list mount namespaces answered ENOTTY.
pub fn without_namespace_list() -> Vec<OsString> {
    install(&[
        format!("{IOCTL}:{NS_MNT_GET_NEXT}={ENOTTY}"),
        format!("{IOCTL}:{NS_MNT_GET_PREV}={ENOTTY}"),
    ])
}

fn install(rules: &[String]) -> Vec<OsString> {
    let ok = Command::new("/usr/bin/python3")
        .args(["-c", "import seccomp"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "python3-seccomp is missing: run tests/deps.sh (apt-get install python3-seccomp)"
    );
    let rules = rules.join(",");
    vec![
        "/usr/bin/python3".into(),
        "-c".into(),
        INSTALL_FILTER.into(),
        rules.into(),
    ]
}

/// As the shipped unit under systemd 252, with openat2 answered as `openat2_errno`.
pub fn unit_like(openat2_errno: u32) -> Vec<(u32, u32)> {
    vec![
        (STATMOUNT, EPERM),
        (LISTMOUNT, EPERM),
        (OPENAT2, openat2_errno),
        (CLONE3, ENOSYS),
    ]
}
