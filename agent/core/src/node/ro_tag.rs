//! The names of read-only raw block devices (see the daemon's `ro_block`). Each such device is
//! named with a tag: this agent's (a hash of its state file's path, so that agents sharing a host
//! never take each other's), and the publication's (volume and target). Publish journals its bind
//! intent durably before it lays the device, so after a crash the record names the tag.

use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::NodeCtx;

/// Every agent's tags start so; the loop controller refuses to detach a volume under one.
pub const TAG_PREFIX: &str = "ebsna-ro:";
const PREFIX: &str = TAG_PREFIX;

/// FNV-1a, 64 bits: a hash that stays the same across builds (tags outlive the binary).
fn fnv(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for b in *part {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// This agent's tags start so.
pub fn agent_prefix(ctx: &NodeCtx) -> String {
    prefix_for(ctx.ledger.path())
}

fn prefix_for(state_file: &Path) -> String {
    let state = state_file.as_os_str().as_bytes();
    format!("{PREFIX}{:08x}:", fnv(&[state]) & 0xffff_ffff)
}

/// The tag of the read-only device of `volume`'s publication at `target`.
pub fn tag(ctx: &NodeCtx, volume: &str, target: &Path) -> String {
    tag_for(ctx.ledger.path(), volume, target)
}

fn tag_for(state_file: &Path, volume: &str, target: &Path) -> String {
    let id = fnv(&[volume.as_bytes(), target.as_os_str().as_bytes()]);
    format!("{}{id:016x}", prefix_for(state_file))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_fit_the_loop_name_and_tell_agents_and_publications_apart() {
        let (a, b) = (
            Path::new("/var/lib/a/state.redb"),
            Path::new("/var/lib/b/state.redb"),
        );
        let t = tag_for(
            a,
            "vol-0123456789abcdef0",
            Path::new("/var/lib/kubelet/pods/x/dev"),
        );
        // lo_file_name holds 64 bytes with its NUL.
        assert!(t.len() <= 63, "{t}");
        assert!(t.starts_with(&prefix_for(a)) && t.starts_with(PREFIX));
        assert!(!t.starts_with(&prefix_for(b)));
        let others = [
            tag_for(
                a,
                "vol-0123456789abcdef0",
                Path::new("/var/lib/kubelet/pods/y/dev"),
            ),
            tag_for(a, "vol-1", Path::new("/var/lib/kubelet/pods/x/dev")),
            tag_for(
                b,
                "vol-0123456789abcdef0",
                Path::new("/var/lib/kubelet/pods/x/dev"),
            ),
        ];
        assert!(others.iter().all(|o| *o != t));
        // Stable across builds: the hash is spelled out, not std's, and a tag an agent laid
        // before an upgrade must still be found after it (the value the daemon's ro_block gave
        // before the pipeline moved to the core).
        assert_eq!(t, "ebsna-ro:f816c673:3cddad61b9deacac");
        assert_eq!(fnv(&[b"a"]), fnv(&[b"a"]));
        assert_ne!(fnv(&[b"ab", b""]), fnv(&[b"a", b"b"]));
    }
}
