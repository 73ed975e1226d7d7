//! Request paths and recorded paths become held entries (the host's `Entry`, see `host`), with
//! the host's refusals in the domain's terms.

use std::path::Path;

use super::NodeCtx;
use super::host::{Entry, PathRefusal};
use crate::error::{Error, Result};
use crate::request::{RequestPath, ValidationError};

/// A request path for work that creates it (stage, publish): missing parents are made.
pub fn prepare(ctx: &NodeCtx, path: &RequestPath) -> Result<Box<dyn Entry>> {
    ctx.host
        .prepare(path.prefix(), path.as_path())
        .map_err(|e| refused(path.field(), path.as_path(), e))
}

/// A request path for work that only acts on what is there; `None`: a directory above it is
/// missing, so nothing can be mounted at it.
pub fn lookup(ctx: &NodeCtx, path: &RequestPath) -> Result<Option<Box<dyn Entry>>> {
    ctx.host
        .lookup(path.prefix(), path.as_path())
        .map_err(|e| refused(path.field(), path.as_path(), e))
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
        PathRefusal::Unexaminable(source) => Error::PathUnexaminable {
            field,
            path: path.to_path_buf(),
            source,
        },
    }
}
