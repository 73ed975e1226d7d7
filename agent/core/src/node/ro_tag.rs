//! The names agents give the loop devices they make (their `lo_file_name`). The loop
//! controller's attachments are named `ebsna-lo:<instance>:<volume>`, so that a second agent on
//! the host, which cannot read this one's records, refuses them (`stacking`); a name can only
//! refuse a device, never make one this agent's.
//!
//! The names of read-only raw block devices (see `read_only` and the host crate's `real_host::read_only`). Each such device is
//! named with a tag: this agent instance's part, and the publication's (volume and target).
//! Publish journals its bind intent durably before it lays the device, so after a crash the
//! record names the tag.
//!
//! The agent's part is a random instance id kept beside the state file (the daemon's
//! `node::instance`): two agents whose state files have one path in two mount namespaces are two
//! instances, so neither ever takes the other's devices. Agents before it used a hash of the
//! state file's path (8 hex digits, not 16): such tags outlive the binary, so they are still
//! read as this agent's ("legacy").

use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::NodeCtx;

/// Every agent's tags start so; the loop controller refuses to detach a volume under one.
pub const TAG_PREFIX: &str = "ebsna-ro:";
const PREFIX: &str = TAG_PREFIX;
/// The loop devices an agent's controller attaches are named so (a nineteenth fresh review's
/// F1): two agents with state directories of their own see nothing of each other's records, and
/// only the name tells a device another agent attached from a free one.
pub const ATTACHED_PREFIX: &str = "ebsna-lo:";

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

/// This agent's part of its tags: the current one (its instance id) and the legacy one (its
/// state file's path), which an agent before instance ids gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentTag {
    current: String,
    legacy: String,
    attached: String,
}

impl AgentTag {
    /// `instance`: 16 hex digits, random, made once with the state directory.
    pub fn new(instance: u64, state_file: &Path) -> Self {
        AgentTag {
            current: format!("{PREFIX}{instance:016x}:"),
            legacy: legacy_prefix(state_file),
            attached: format!("{ATTACHED_PREFIX}{instance:016x}:"),
        }
    }

    /// The prefix of the tags this agent lays.
    pub fn prefix(&self) -> &str {
        &self.current
    }

    /// Both prefixes this agent's tags may start with (current first).
    pub fn prefixes(&self) -> [&str; 2] {
        [&self.current, &self.legacy]
    }

    /// Whether `tag` is one this agent laid, now or before instance ids.
    pub fn owns(&self, tag: &str) -> bool {
        self.prefixes().iter().any(|p| tag.starts_with(p))
    }

    /// The tag of the read-only device of `volume`'s publication at `target`.
    pub fn tag(&self, volume: &str, target: &Path) -> String {
        format!("{}{:016x}", self.current, publication(volume, target))
    }

    /// The name of the loop device the loop controller attaches for `volume`.
    pub fn attached_tag(&self, volume: &str) -> String {
        format!("{}{:016x}", self.attached, fnv(&[volume.as_bytes()]))
    }

    /// Whether a loop device of this name is one another agent made: named with an agent's
    /// prefix, and not this one's (current or legacy). Untagged names (an operator's device, a
    /// file's path) are nobody's here.
    pub fn made_by_another(&self, name: &str) -> bool {
        let agents = name.starts_with(PREFIX) || name.starts_with(ATTACHED_PREFIX);
        agents && !self.owns(name) && !name.starts_with(&self.attached)
    }

    /// The tag the same publication had under the legacy scheme.
    pub fn legacy_tag(&self, volume: &str, target: &Path) -> String {
        format!("{}{:016x}", self.legacy, publication(volume, target))
    }
}

fn publication(volume: &str, target: &Path) -> u64 {
    fnv(&[volume.as_bytes(), target.as_os_str().as_bytes()])
}

fn legacy_prefix(state_file: &Path) -> String {
    let state = state_file.as_os_str().as_bytes();
    format!("{PREFIX}{:08x}:", fnv(&[state]) & 0xffff_ffff)
}

/// This agent's tags start so.
pub fn agent_prefix(ctx: &NodeCtx) -> &str {
    ctx.agent_tag.prefix()
}

/// The tag of the read-only device of `volume`'s publication at `target`.
pub fn tag(ctx: &NodeCtx, volume: &str, target: &Path) -> String {
    ctx.agent_tag.tag(volume, target)
}

/// The publication part of any agent's tag, current or legacy.
pub fn publication_part(tag: &str) -> Option<&str> {
    let rest = tag.strip_prefix(PREFIX)?;
    let (agent, publication) = rest.split_once(':')?;
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    ((hex(agent, 8) || hex(agent, 16)) && hex(publication, 16)).then_some(publication)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: u64 = 0x0123_4567_89ab_cdef;

    #[test]
    fn tags_fit_the_loop_name_and_tell_agents_and_publications_apart() {
        let (a, b) = (
            AgentTag::new(ID, Path::new("/var/lib/a/state.redb")),
            AgentTag::new(ID + 1, Path::new("/var/lib/b/state.redb")),
        );
        let x = Path::new("/var/lib/kubelet/pods/x/dev");
        let t = a.tag("vol-0123456789abcdef0", x);
        // lo_file_name holds 64 bytes with its NUL.
        assert!(t.len() <= 63, "{t}");
        assert!(t.starts_with(a.prefix()) && t.starts_with(PREFIX) && a.owns(&t));
        assert!(!b.owns(&t));
        let others = [
            a.tag(
                "vol-0123456789abcdef0",
                Path::new("/var/lib/kubelet/pods/y/dev"),
            ),
            a.tag("vol-1", x),
            b.tag("vol-0123456789abcdef0", x),
        ];
        assert!(others.iter().all(|o| *o != t));
        assert_eq!(t, "ebsna-ro:0123456789abcdef:3cddad61b9deacac");
        assert_eq!(publication_part(&t), Some("3cddad61b9deacac"));
        assert_eq!(fnv(&[b"a"]), fnv(&[b"a"]));
        assert_ne!(fnv(&[b"ab", b""]), fnv(&[b"a", b"b"]));
    }

    #[test]
    fn one_state_path_in_two_namespaces_is_two_agents() {
        let path = Path::new("/var/lib/ebs-node-agent/state.redb");
        let (a, b) = (AgentTag::new(ID, path), AgentTag::new(ID ^ 1, path));
        let x = Path::new("/var/lib/kubelet/pods/x/dev");
        assert!(!b.owns(&a.tag("v", x)) && !a.owns(&b.tag("v", x)));
        // Both still read the tags the path's agent laid before instance ids.
        assert!(a.owns(&a.legacy_tag("v", x)) && b.owns(&a.legacy_tag("v", x)));
    }

    #[test]
    fn another_agents_devices_are_told_by_their_names() {
        let path = Path::new("/var/lib/ebs-node-agent/state.redb");
        let (a, b) = (AgentTag::new(ID, path), AgentTag::new(ID ^ 1, path));
        let x = Path::new("/var/lib/kubelet/pods/x/dev");
        let attached = a.attached_tag("vol-0123456789abcdef0");
        assert_eq!(attached, "ebsna-lo:0123456789abcdef:29d0ead3051e24c8");
        assert!(attached.len() <= 63);
        assert_ne!(attached, a.attached_tag("vol-1"));
        for theirs in [&attached, &a.tag("v", x)] {
            assert!(
                b.made_by_another(theirs) && !a.made_by_another(theirs),
                "{theirs}"
            );
        }
        // Another state path's legacy tag is another agent's; this path's is this agent's.
        let other = AgentTag::new(ID, Path::new("/elsewhere/state.redb"));
        assert!(a.made_by_another(&other.legacy_tag("v", x)));
        assert!(!b.made_by_another(&a.legacy_tag("v", x)));
        for nobodys in [
            "",
            "/var/lib/ebs-node-agent/volumes/v.img",
            "ebsna-",
            "ebsna-r",
        ] {
            assert!(!a.made_by_another(nobodys), "{nobodys}");
        }
    }

    #[test]
    fn attached_names_tell_volumes_and_agents_apart_and_fit_the_loop_name() {
        let (a, b) = (
            AgentTag::new(ID, Path::new("/s")),
            AgentTag::new(ID + 1, Path::new("/s")),
        );
        let long = "v".repeat(128);
        for v in ["vol-1", "vol-2", long.as_str()] {
            let t = a.attached_tag(v);
            assert!(t.len() <= 63 && t.starts_with(ATTACHED_PREFIX), "{t}");
            assert_ne!(t, b.attached_tag(v));
            // Not a read-only device's tag: the sweeps never see it.
            assert!(!t.starts_with(TAG_PREFIX) && publication_part(&t).is_none());
        }
        assert_ne!(a.attached_tag("vol-1"), a.attached_tag("vol-2"));
    }

    #[test]
    fn tags_laid_before_instance_ids_are_still_this_agents() {
        // Stable across builds: the hash is spelled out, not std's; the value the daemon's
        // ro_block gave before the pipeline moved to the core, and before instance ids.
        let a = AgentTag::new(ID, Path::new("/var/lib/a/state.redb"));
        let old = "ebsna-ro:f816c673:3cddad61b9deacac";
        assert_eq!(
            a.legacy_tag(
                "vol-0123456789abcdef0",
                Path::new("/var/lib/kubelet/pods/x/dev")
            ),
            old
        );
        assert!(a.owns(old));
        assert_eq!(publication_part(old), Some("3cddad61b9deacac"));
        // A legacy prefix never matches a current tag (8 hex digits then ':', not 16).
        assert!(!a.tag("v", Path::new("/t")).starts_with(a.prefixes()[1]));
        assert_eq!(publication_part("ebsna-ro:xyz:3cddad61b9deacac"), None);
    }
}
