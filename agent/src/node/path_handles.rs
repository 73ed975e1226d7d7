//! Request paths and recorded paths become anchored handles (see `host::anchor`), with their
//! errors in the domain's terms.

use std::io;
use std::path::Path;

use super::NodeCtx;
use crate::error::{Error, Result};
use ebs_node_core::request::{RequestPath, ValidationError};
use ebs_node_host::anchor::Anchored;

/// A request path for work that creates it (stage, publish): missing parents are made.
pub fn prepare(path: &RequestPath) -> Result<Anchored> {
    Anchored::prepare(path.prefix(), path.as_path())
        .map_err(|e| refused(path.field(), path.as_path(), e))
}

/// A request path for work that only acts on what is there; `None`: a directory above it is
/// missing, so nothing can be mounted at it.
pub fn lookup(path: &RequestPath) -> Result<Option<Anchored>> {
    Anchored::lookup(path.prefix(), path.as_path())
        .map_err(|e| refused(path.field(), path.as_path(), e))
}

/// A path from a record (checked when it was recorded), resolved below the allowed prefix it
/// lies under today; the agent's own paths (v0.1 staging) lie under the state directory.
pub fn lookup_recorded(ctx: &NodeCtx, path: &Path) -> Result<Option<Anchored>> {
    let prefix = ctx
        .roots
        .allowed
        .iter()
        .chain(ctx.roots.reserved.iter())
        .filter(|p| path.starts_with(p) && path != p.as_path())
        .max_by_key(|p| p.as_os_str().len())
        .map(|p| p.as_path())
        .unwrap_or(Path::new("/"));
    Anchored::lookup(prefix, path).map_err(|e| refused("recorded path", path, e))
}

/// Why a path is refused: a symlink on the way is the caller's error; anything else (EIO,
/// ENOTCONN below a dead mount, EACCES) means the path cannot be examined, so it cannot be
/// proven safe.
fn refused(field: &'static str, path: &Path, e: io::Error) -> Error {
    match e.raw_os_error() {
        Some(libc::ELOOP) | Some(libc::EXDEV) => ValidationError::BadPath {
            field,
            path: path.to_path_buf(),
            why: "a component of it is a symbolic link, or leads outside its allowed prefix",
        }
        .into(),
        Some(libc::ENOTDIR) => ValidationError::BadPath {
            field,
            path: path.to_path_buf(),
            why: "a component of it is not a directory (or is a symbolic link)",
        }
        .into(),
        _ => Error::PathUnexaminable {
            field,
            path: path.to_path_buf(),
            source: e,
        },
    }
}
