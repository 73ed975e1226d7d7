//! Which volume each staging and target path belongs to, and which paths an operation is using
//! right now. The volume guard orders calls on one volume; this orders calls on one path, whatever
//! volume they name, and keeps volumes' paths apart: no staging or target path is the same as,
//! inside, or above another record's path (a target inside another volume's staging path would
//! write into that volume; one above it would cover it).
//!
//! Loaded from the ledger at start-up, then kept in step by the operations that write the
//! records, right after each commit.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::ledger::Ledger;

use super::NodeCtx;
use super::host::Ancestry;
use super::lock;
use super::ownership::recorded_devnum;
use crate::DevNum;
use crate::error::{Error, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Use {
    Staging,
    Target,
}

impl Use {
    fn word(self) -> &'static str {
        match self {
            Use::Staging => "staging path",
            Use::Target => "publication target",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Claim {
    volume: String,
    usage: Use,
}

#[derive(Default)]
struct State {
    recorded: BTreeMap<PathBuf, Claim>,
    busy: BTreeMap<PathBuf, Claim>,
}

#[derive(Clone, Default)]
pub struct PathClaims {
    state: Arc<Mutex<State>>,
}

/// A path held for one operation; released on drop.
pub struct PathTurn {
    state: Arc<Mutex<State>>,
    path: PathBuf,
}

impl Drop for PathTurn {
    fn drop(&mut self) {
        lock(&self.state).busy.remove(&self.path);
    }
}

fn nested(a: &Path, b: &Path) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

impl PathClaims {
    /// Replaces the recorded paths with every staging path and publication target the ledger
    /// records (at start-up, before recovery, which forgets what it drops). Read volume by
    /// volume: a record that does not decode leaves out only its own volume's paths (start-up
    /// recovery marks that volume as needing attention).
    pub fn reload_tolerant(&self, ledger: &dyn Ledger) {
        let mut recorded = BTreeMap::new();
        let ids = ledger.recorded_volume_ids().unwrap_or_else(|e| {
            tracing::warn!(error = %e, "the recorded volumes cannot be listed");
            Vec::new()
        });
        for id in ids {
            if let Ok(Some(v)) = ledger.staged(&id)
                && !v.staging_path.as_os_str().is_empty()
            {
                recorded.insert(
                    v.staging_path,
                    Claim {
                        volume: v.volume_id,
                        usage: Use::Staging,
                    },
                );
            }
            for p in ledger.publications(&id).unwrap_or_default() {
                recorded.insert(
                    p.target_path,
                    Claim {
                        volume: p.volume_id,
                        usage: Use::Target,
                    },
                );
            }
        }
        lock(&self.state).recorded = recorded;
    }

    /// Takes `path` for an operation on `volume`. ABORTED while another operation uses the path;
    /// with `claim` (stage, publish), FAILED_PRECONDITION when the path is, lies inside, or lies
    /// above another volume's path, or one of this volume's used otherwise.
    pub fn take(&self, volume: &str, path: &Path, usage: Use, claim: bool) -> Result<PathTurn> {
        let mut s = lock(&self.state);
        if let Some(other) = s.busy.get(path) {
            return Err(Error::PathBusy {
                path: path.to_path_buf(),
                volume: other.volume.clone(),
            });
        }
        let me = Claim {
            volume: volume.to_string(),
            usage,
        };
        if claim {
            let clash = s
                .recorded
                .iter()
                .chain(s.busy.iter())
                .find(|(p, c)| nested(p, path) && !(p.as_path() == path && **c == me));
            if let Some((p, c)) = clash {
                let how = if p.as_path() == path {
                    "is"
                } else if path.starts_with(p) {
                    "lies inside"
                } else {
                    "lies above"
                };
                return Err(Error::PathOfAnotherVolume {
                    path: path.to_path_buf(),
                    how,
                    usage: c.usage.word(),
                    volume: c.volume.clone(),
                    theirs: p.clone(),
                });
            }
        }
        s.busy.insert(path.to_path_buf(), me);
        Ok(PathTurn {
            state: Arc::clone(&self.state),
            path: path.to_path_buf(),
        })
    }

    /// The other volume whose recorded path `path` is, lies inside or lies above, if any: no
    /// tear-down of `volume` takes anything away there, whatever it binds (a forty-eighth fresh
    /// review's F1: a raw block staging rebuilt with no path took another volume's
    /// publication down as its own replaced bind).
    pub fn another_volumes(&self, volume: &str, path: &Path) -> Option<String> {
        lock(&self.state)
            .recorded
            .iter()
            .find(|(p, c)| c.volume != volume && nested(p, path))
            .map(|(_, c)| c.volume.clone())
    }

    /// The ledger now records `path` as `volume`'s.
    pub fn record(&self, volume: &str, path: &Path, usage: Use) {
        lock(&self.state).recorded.insert(
            path.to_path_buf(),
            Claim {
                volume: volume.to_string(),
                usage,
            },
        );
    }

    /// The ledger no longer records `path` for `volume`.
    pub fn forget(&self, volume: &str, path: &Path) {
        let mut s = lock(&self.state);
        if s.recorded.get(path).is_some_and(|c| c.volume == volume) {
            s.recorded.remove(path);
        }
    }

    /// Drops every path of a volume (DeleteVolume forgot its records).
    pub fn forget_volume(&self, volume: &str) {
        lock(&self.state).recorded.retain(|_, c| c.volume != volume);
    }
}

/// Refuses a new staging path or target whose directory, or a directory above it below the
/// prefix, lies on a volume's filesystem: nesting seen through places, not names (a bind alias
/// of volume A's staging path below the prefix would put B inside A's filesystem). The ledger
/// is read only when a directory on the way lies on another filesystem than the prefix.
pub fn not_inside_a_volume(ctx: &NodeCtx, path: &Path, ancestry: &Ancestry) -> Result<()> {
    let mut devices: Vec<DevNum> = ancestry
        .dirs
        .iter()
        .map(|p| p.dev)
        .filter(|d| *d != ancestry.prefix.dev)
        .collect();
    devices.dedup();
    if devices.is_empty() {
        return Ok(());
    }
    for id in ctx.ledger.recorded_volume_ids()? {
        let Some(v) = ctx.ledger.staged(&id)? else {
            continue;
        };
        if recorded_devnum(ctx, &v).is_some_and(|d| devices.contains(&d)) {
            return Err(Error::PathOfAnotherVolume {
                path: path.to_path_buf(),
                how: "lies (through another name) inside the filesystem at",
                usage: "staging path",
                volume: v.volume_id,
                theirs: v.staging_path,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_of_volumes_never_nest() {
        let c = PathClaims::default();
        c.record("a", Path::new("/k/staging/a"), Use::Staging);
        c.record("a", Path::new("/k/pods/1/a"), Use::Target);
        assert!(
            c.take("a", Path::new("/k/staging/a"), Use::Staging, true)
                .is_ok()
        );
        assert!(
            c.take("a", Path::new("/k/pods/1/a"), Use::Target, true)
                .is_ok()
        );
        for (vol, p, u) in [
            ("b", "/k/staging/a", Use::Staging),
            ("b", "/k/staging/a/x", Use::Target),
            ("b", "/k/staging", Use::Staging),
            ("a", "/k/staging/a/inside", Use::Target),
            ("a", "/k/staging/a", Use::Target),
        ] {
            let e = c.take(vol, Path::new(p), u, true).err().expect(p);
            assert!(matches!(e, Error::PathOfAnotherVolume { .. }), "{p}: {e}");
        }
        assert!(
            c.take("b", Path::new("/k/staging/b"), Use::Staging, true)
                .is_ok()
        );
    }

    #[test]
    fn one_operation_per_path_whatever_the_volume() {
        let c = PathClaims::default();
        let turn = c.take("a", Path::new("/k/x"), Use::Staging, true).unwrap();
        let e = c
            .take("b", Path::new("/k/x"), Use::Staging, false)
            .err()
            .unwrap();
        assert!(matches!(e, Error::PathBusy { .. }));
        let e = c
            .take("b", Path::new("/k/x/y"), Use::Target, true)
            .err()
            .unwrap();
        assert!(
            matches!(e, Error::PathOfAnotherVolume { .. }),
            "an in-flight claim counts too"
        );
        drop(turn);
        assert!(c.take("b", Path::new("/k/x"), Use::Staging, false).is_ok());
    }
}
