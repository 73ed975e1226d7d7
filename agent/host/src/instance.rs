//! This agent instance's id: 16 random hex digits in `<state dir>/instance-id`, made once with
//! the state directory and kept for good. It names the loop devices the agent makes, its
//! read-only block devices and the loop controller's attachments (`ro_tag::AgentTag`), so two
//! agents on one host (even whose state directories have one path in two mount namespaces) never
//! take each other's. It lives beside the state file, not in it: rebuilding or
//! resetting the state file (`recover`) keeps it, so the agent still knows the devices it laid.

use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use crate::private;
use ebs_node_core::node::ro_tag::AgentTag;

pub const FILE: &str = "instance-id";

/// The agent's tag part for the state file `state_file` in `state_dir`: the id there, made if
/// there is none.
pub fn agent_tag(state_dir: &Path, state_file: &Path) -> io::Result<AgentTag> {
    Ok(AgentTag::new(load_or_create(state_dir)?, state_file))
}

/// The id in `state_dir`, made (atomically: written aside, then linked in) if there is none.
pub fn load_or_create(state_dir: &Path) -> io::Result<u64> {
    let path = state_dir.join(FILE);
    match read(&path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        other => return other,
    }
    let aside = state_dir.join(format!(".{FILE}.{}", std::process::id()));
    let id = random()?;
    {
        let mut f = private::open_file(
            &aside,
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true),
        )?;
        writeln!(f, "{id:016x}")?;
        f.sync_all()?;
    }
    // A link never replaces: an id another start linked first wins.
    let linked = std::fs::hard_link(&aside, &path);
    let _ = std::fs::remove_file(&aside);
    match linked {
        Ok(()) => {
            std::fs::File::open(state_dir)?.sync_all()?;
            tracing::info!(path = %path.display(), "made this agent's instance id");
            Ok(id)
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => read(&path),
        Err(e) => Err(e),
    }
}

fn read(path: &PathBuf) -> io::Result<u64> {
    let text = std::fs::read_to_string(path)?;
    let hex = text.trim();
    if hex.len() != 16 {
        return Err(damaged(path));
    }
    u64::from_str_radix(hex, 16).map_err(|_| damaged(path))
}

fn damaged(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!(
            "{} is not 16 hex digits: restore it, or remove it for a new id (then this agent no \
             longer finds the read-only block devices it laid before)",
            path.display()
        ),
    )
}

fn random() -> io::Result<u64> {
    let mut b = [0u8; 8];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(u64::from_ne_bytes(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_id_is_made_once_and_kept() {
        let dir = std::env::temp_dir().join(format!("instance-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let a = load_or_create(&dir).unwrap();
        assert_eq!(load_or_create(&dir).unwrap(), a);
        let other = dir.join("other");
        std::fs::create_dir_all(&other).unwrap();
        assert_ne!(
            load_or_create(&other).unwrap(),
            a,
            "two directories, one id"
        );
        std::fs::write(dir.join(FILE), "nonsense\n").unwrap();
        assert!(
            load_or_create(&dir).is_err(),
            "a damaged id is never replaced silently"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
