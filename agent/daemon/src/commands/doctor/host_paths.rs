//! The doctor's directory checks: can the agent create its socket and state there, and do mounts
//! below kubelet's directory reach kubelet? Nothing is created: the nearest existing ancestor
//! is asked instead.

use std::path::Path;

use nix::unistd::{AccessFlags, access};

use super::Check;

/// Whether the agent can create (or write to) `dir`: the nearest existing ancestor must be a
/// writable directory.
pub fn writable_dir(name: &'static str, dir: &Path, needed: bool) -> Check {
    let shown = dir.display();
    let Some(existing) = dir.ancestors().find(|a| a.exists()) else {
        return Check::lacking(name, needed, format!("{shown}: no ancestor exists"), "");
    };
    if !existing.is_dir() {
        return Check::lacking(
            name,
            needed,
            format!(
                "{shown} cannot be created: {} is not a directory",
                existing.display()
            ),
            "choose another directory",
        );
    }
    let how = if existing == dir {
        "writable".to_string()
    } else {
        format!("can be created (below {})", existing.display())
    };
    match access(existing, AccessFlags::W_OK | AccessFlags::X_OK) {
        Ok(()) => Check::ok(name, format!("{shown} {how}")),
        Err(e) => Check::lacking(
            name,
            needed,
            format!("{} is not writable ({e})", existing.display()),
            "run as root, or mount it read-write (a container: a host path volume)",
        ),
    }
}

/// kubelet must see the mounts the agent makes below its directory: the mount that holds it has
/// to be shared (in a container: a Bidirectional mount of the host's directory).
pub fn kubelet_propagation(kubelet_dir: &Path) -> Check {
    const NAME: &str = "kubelet mount propagation";
    if !kubelet_dir.is_dir() {
        return Check::skipped(
            NAME,
            format!("{} is not here (no kubelet)", kubelet_dir.display()),
        );
    }
    let table = match std::fs::read_to_string("/proc/self/mountinfo") {
        Ok(t) => t,
        Err(e) => {
            return Check::lacking(NAME, false, format!("reading mountinfo: {e}"), "");
        }
    };
    match propagation_of(&table, kubelet_dir) {
        Some((mount_point, true)) => Check::ok(
            NAME,
            format!(
                "{} is on the shared mount {mount_point}",
                kubelet_dir.display()
            ),
        ),
        Some((mount_point, false)) => Check::lacking(
            NAME,
            false,
            format!(
                "{} is on the private mount {mount_point}: kubelet would not see the agent's \
                 mounts",
                kubelet_dir.display()
            ),
            format!(
                "mount --make-rshared {mount_point} (systemd makes / shared at boot); a \
                 container: mount the host's kubelet directory with Bidirectional propagation"
            ),
        ),
        None => Check::lacking(
            NAME,
            false,
            format!("no mount holds {} in this namespace", kubelet_dir.display()),
            "",
        ),
    }
}

/// The mount point that holds `path` (the longest one above it) and whether it is shared, from
/// /proc/self/mountinfo's text. Mount points are octal-escaped there (`\040` for a space).
pub fn propagation_of(table: &str, path: &Path) -> Option<(String, bool)> {
    let mut best: Option<(String, bool)> = None;
    for line in table.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let (Some(point), Some(dash)) = (fields.get(4), fields.iter().position(|f| *f == "-"))
        else {
            continue;
        };
        let point = unescape(point);
        let holds = path.starts_with(&point);
        let longer = best.as_ref().is_none_or(|(b, _)| point.len() >= b.len());
        if holds && longer {
            let shared = fields
                .get(6..dash)
                .is_some_and(|opt| opt.iter().any(|f| f.starts_with("shared:")));
            best = Some((point, shared));
        }
    }
    best
}

fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (bytes[i], octal) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "\
22 1 253:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
30 22 0:25 / /var/lib/kubelet rw,relatime - tmpfs tmpfs rw
31 22 0:26 / /mnt/with\\040space rw shared:7 master:1 - tmpfs tmpfs rw
";

    #[test]
    fn the_longest_mount_above_a_path_decides() {
        assert_eq!(
            propagation_of(TABLE, Path::new("/var/lib/kubelet/pods")),
            Some(("/var/lib/kubelet".into(), false))
        );
        assert_eq!(
            propagation_of(TABLE, Path::new("/var/lib/nomad")),
            Some(("/".into(), true))
        );
        assert_eq!(
            propagation_of(TABLE, Path::new("/mnt/with space/x")),
            Some(("/mnt/with space".into(), true))
        );
        // In a chroot no mount may lie at or above the path.
        assert_eq!(
            propagation_of("30 22 0:25 / /other rw - tmpfs t rw\n", Path::new("/x")),
            None
        );
    }

    #[test]
    fn directories() {
        let dir = std::env::temp_dir();
        assert_eq!(
            writable_dir("d", &dir, true).outcome,
            super::super::Outcome::Ok
        );
        let file = dir.join(format!("doctor-file-{}", std::process::id()));
        std::fs::write(&file, b"x").unwrap();
        let under_file = writable_dir("d", &file.join("state"), true);
        std::fs::remove_file(&file).unwrap();
        assert_eq!(under_file.outcome, super::super::Outcome::Missing);
        assert!(
            under_file.detail.contains("is not a directory"),
            "{}",
            under_file.detail
        );
    }
}
