//! Request paths and recorded paths become held entries (the host's `Entry`, see `host`), with
//! the host's refusals in the domain's terms.

use std::path::Path;

use super::host::{Ancestry, Entry, PathRefusal, Place};
use super::{NodeCtx, claims};
use crate::error::{Error, Result};
use crate::request::{RequestPath, ValidationError};
use crate::seam::FileKind;

/// A request path for work that creates it (stage, publish): missing parents are made. Where
/// it lies is checked as places, not names: neither in the agent's own directories nor in a
/// volume's filesystem, under any name.
pub fn prepare(ctx: &NodeCtx, path: &RequestPath) -> Result<Box<dyn Entry>> {
    let refuse = |e| refused(path.field(), path.as_path(), e);
    let entry = match ctx
        .host
        .lookup(path.prefix(), path.as_path())
        .map_err(refuse)?
    {
        Some(entry) => entry,
        None => {
            // Directories are to be made: the one they go in is checked first, so that a
            // refused path leaves nothing made behind.
            check_where_made(ctx, path)?;
            ctx.host
                .prepare(path.prefix(), path.as_path())
                .map_err(refuse)?
        }
    };
    for_a_mount(ctx, path, &*entry)?;
    Ok(entry)
}

/// The deepest existing directory above `path` (below its prefix), which the missing ones will
/// be made in: neither one of the agent's own directories nor on a volume's filesystem.
fn check_where_made(ctx: &NodeCtx, path: &RequestPath) -> Result<()> {
    let refuse = |e| refused(path.field(), path.as_path(), e);
    for above in path.as_path().ancestors().skip(1) {
        if above == path.prefix() || !above.starts_with(path.prefix()) {
            break;
        }
        let Some(entry) = ctx.host.lookup(path.prefix(), above).map_err(refuse)? else {
            continue;
        };
        let unexaminable = |source| Error::PathUnexaminable {
            field: path.field(),
            path: path.as_path().to_path_buf(),
            source,
        };
        let Some(st) = entry.stat().map_err(unexaminable)? else {
            continue;
        };
        let mut ancestry = confine(ctx, path, &*entry)?;
        ancestry.dirs.insert(
            0,
            Place {
                dev: st.dev,
                ino: st.ino,
            },
        );
        return claims::not_inside_a_volume(ctx, path.as_path(), &ancestry);
    }
    Ok(())
}

/// A request path for work that only acts on what is there; `None`: a directory above it is
/// missing, so nothing can be mounted at it. Never in the agent's own directories, under any
/// name.
pub fn lookup(ctx: &NodeCtx, path: &RequestPath) -> Result<Option<Box<dyn Entry>>> {
    let entry = ctx
        .host
        .lookup(path.prefix(), path.as_path())
        .map_err(|e| refused(path.field(), path.as_path(), e))?;
    if let Some(entry) = &entry {
        confine(ctx, path, &**entry)?;
    }
    Ok(entry)
}

/// For work that mounts at an entry `lookup` found (publish): what `prepare` checks.
pub fn for_a_mount(ctx: &NodeCtx, path: &RequestPath, entry: &dyn Entry) -> Result<()> {
    let ancestry = confine(ctx, path, entry)?;
    claims::not_inside_a_volume(ctx, path.as_path(), &ancestry)
}

/// Refuses an entry that is, or lies inside, one of the agent's own directories by what the
/// directories are (device and inode), whatever name reaches them: the lexical rule at the door
/// sees names only, and a bind (the DaemonSet's `/csi` is also `<kubelet>/plugins/<driver>`)
/// gives a directory a second one.
fn confine(ctx: &NodeCtx, path: &RequestPath, entry: &dyn Entry) -> Result<Ancestry> {
    let unexaminable = |source| Error::PathUnexaminable {
        field: path.field(),
        path: path.as_path().to_path_buf(),
        source,
    };
    let ancestry = entry.ancestry().map_err(unexaminable)?;
    let here = entry
        .stat()
        .map_err(unexaminable)?
        .filter(|st| st.kind == FileKind::Directory)
        .map(|st| Place {
            dev: st.dev,
            ino: st.ino,
        });
    let reserved = ctx.roots.reserved_places(|p| ctx.host.place_of(p));
    if reserved
        .iter()
        .any(|(_, r)| here == Some(*r) || ancestry.dirs.contains(r))
    {
        return Err(ValidationError::BadPath {
            field: path.field(),
            path: path.as_path().to_path_buf(),
            why: "it is, or lies inside, the agent's own state or socket directory under \
                  another name (a bind or a second mount of it)",
        }
        .into());
    }
    Ok(ancestry)
}

/// A path from a record (checked when it was recorded), resolved below the allowed prefix it
/// lies under today; the agent's own paths (v0.1 staging) lie under the state directory.
pub fn lookup_recorded(ctx: &NodeCtx, path: &Path) -> Result<Option<Box<dyn Entry>>> {
    ctx.host
        .lookup(recorded_prefix(ctx, path), path)
        .map_err(|e| refused("recorded path", path, e))
}

/// The longest allowed or reserved prefix a recorded path lies strictly below ("/" if none).
fn recorded_prefix<'a>(ctx: &'a NodeCtx, path: &Path) -> &'a Path {
    ctx.roots
        .allowed
        .iter()
        .chain(ctx.roots.reserved.iter())
        .filter(|p| path.starts_with(p) && path != p.as_path())
        .max_by_key(|p| p.as_os_str().len())
        .map(|p| p.as_path())
        .unwrap_or(Path::new("/"))
}

/// Why a path is refused: a symlink on the way is the caller's error; anything else (EIO,
/// ENOTCONN below a dead mount, EACCES) means the path cannot be examined, so it cannot be
/// proven safe.
pub fn refused(field: &'static str, path: &Path, e: PathRefusal) -> Error {
    match e {
        PathRefusal::Symlink => ValidationError::BadPath {
            field,
            path: path.to_path_buf(),
            why: "a component of it is a symbolic link, or leads outside its allowed prefix",
        }
        .into(),
        PathRefusal::NotDirectory => ValidationError::BadPath {
            field,
            path: path.to_path_buf(),
            why: "a component of it is not a directory (or is a symbolic link)",
        }
        .into(),
        // ENAMETOOLONG: a component longer than the filesystem allows is the caller's error (a
        // twenty-eighth fresh review's low: it read as a dead mount, FAILED_PRECONDITION).
        PathRefusal::Unexaminable(source)
            if source.kind() == std::io::ErrorKind::InvalidFilename =>
        {
            ValidationError::BadPath {
                field,
                path: path.to_path_buf(),
                why: "a component of it is longer than the filesystem allows",
            }
            .into()
        }
        PathRefusal::Unexaminable(source) => Error::PathUnexaminable {
            field,
            path: path.to_path_buf(),
            source,
        },
    }
}
