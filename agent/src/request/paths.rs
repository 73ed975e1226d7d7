//! Paths handed to us by the CO. At the door they become `RequestPath` (absolute, normalised,
//! inside an allowed prefix: no host access), and with the host work, off the async executor,
//! `ConfinedPath` (no symlink below the prefix), so nothing downstream can be led outside the
//! roots the operator allowed, and a lookup hanging below a dead mount never stalls Probe.

use std::path::{Component, Path, PathBuf};

use super::ValidationError;

/// Linux PATH_MAX: the spec asks us to accept the OS maximum.
pub const MAX_PATH_BYTES: usize = 4096;

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConfinedPath(PathBuf);

impl ConfinedPath {
    pub fn as_path(&self) -> &Path {
        &self.0
    }

    /// A path the agent builds itself under a prefix it owns (v0.1 internal staging).
    pub fn trusted(path: PathBuf) -> Self {
        ConfinedPath(path)
    }
}

/// A request path that passed the checks which need no host access: absolute, normalised,
/// inside an allowed prefix. Only `confine` makes a `ConfinedPath` of it: that walk asks the
/// host's file tree, and an lstat below a hung mount can block for minutes, so it runs on a
/// blocking thread and never on the async executor that answers Probe.
#[derive(Clone, Debug)]
pub struct RequestPath {
    field: &'static str,
    path: PathBuf,
    prefix: PathBuf,
}

impl RequestPath {
    pub fn parse(
        field: &'static str,
        raw: &str,
        allowed: &[PathBuf],
    ) -> Result<Self, ValidationError> {
        let path = normalise(field, raw)?;
        let prefix = allowed
            .iter()
            .filter(|p| path.starts_with(p))
            .max_by_key(|p| p.as_os_str().len())
            .ok_or_else(|| ValidationError::OutsideAllowedRoots {
                field,
                path: path.clone(),
            })?
            .clone();
        Ok(RequestPath {
            field,
            path,
            prefix,
        })
    }

    pub fn as_path(&self) -> &Path {
        &self.path
    }

    /// No symlink below the prefix (blocking: see the type's comment).
    pub fn confine(self) -> Result<ConfinedPath, ValidationError> {
        reject_symlinks_below(self.field, &self.prefix, &self.path)?;
        Ok(ConfinedPath(self.path))
    }
}

impl AsRef<Path> for ConfinedPath {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl std::fmt::Display for ConfinedPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.display().fmt(f)
    }
}

/// Lexical checks: required, absolute, bounded, no NUL, no `.`/`..`; trailing and doubled
/// slashes are folded, since kubelet and Nomad are not always consistent about them.
fn normalise(field: &'static str, raw: &str) -> Result<PathBuf, ValidationError> {
    if raw.is_empty() {
        return Err(ValidationError::Missing(field));
    }
    if raw.len() > MAX_PATH_BYTES {
        return Err(ValidationError::TooLong {
            field,
            max: MAX_PATH_BYTES,
        });
    }
    if raw.bytes().any(|b| b == 0 || b == b'\n') {
        return Err(ValidationError::BadPath {
            field,
            path: raw.into(),
            why: "it contains a NUL or newline byte",
        });
    }
    let path = Path::new(raw);
    if !path.is_absolute() {
        return Err(ValidationError::BadPath {
            field,
            path: raw.into(),
            why: "it is not absolute",
        });
    }
    let mut out = PathBuf::from("/");
    for c in path.components() {
        match c {
            Component::RootDir => {}
            Component::Normal(part) => out.push(part),
            Component::CurDir | Component::ParentDir | Component::Prefix(_) => {
                return Err(ValidationError::BadPath {
                    field,
                    path: raw.into(),
                    why: "it contains '.' or '..' components",
                });
            }
        }
    }
    if raw.split('/').skip(1).any(|s| s == ".") {
        return Err(ValidationError::BadPath {
            field,
            path: raw.into(),
            why: "it contains '.' or '..' components",
        });
    }
    if out == Path::new("/") {
        return Err(ValidationError::BadPath {
            field,
            path: raw.into(),
            why: "it is the root directory",
        });
    }
    Ok(out)
}

/// Every existing component strictly below the allowed prefix must be a real directory or file,
/// never a symlink: a symlink could send a mount or an unlink anywhere on the host. The prefix
/// itself is the operator's choice and may be a symlink (some hosts link /var/lib/kubelet).
fn reject_symlinks_below(
    field: &'static str,
    prefix: &Path,
    path: &Path,
) -> Result<(), ValidationError> {
    let rest = path.strip_prefix(prefix).unwrap_or(path);
    let mut current = prefix.to_path_buf();
    for part in rest.components() {
        current.push(part);
        match std::fs::symlink_metadata(&current) {
            Ok(meta) if meta.file_type().is_symlink() => {
                return Err(ValidationError::BadPath {
                    field,
                    path: path.into(),
                    why: "a component of it is a symbolic link",
                });
            }
            Ok(_) => {}
            // Not there yet: the rest cannot be a symlink either.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(_) => {
                // Not a directory, permission trouble: the later syscall reports it precisely.
                return Ok(());
            }
        }
    }
    Ok(())
}

/// Parses the operator's `--allowed-path-prefix` values (absolute, normalised).
pub fn parse_prefix(raw: &str) -> Result<PathBuf, String> {
    normalise("allowed-path-prefix", raw).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn confined(
        field: &'static str,
        raw: &str,
        allowed: &[PathBuf],
    ) -> Result<ConfinedPath, ValidationError> {
        RequestPath::parse(field, raw, allowed)?.confine()
    }

    fn allowed() -> Vec<PathBuf> {
        vec![PathBuf::from("/var/lib/kubelet"), PathBuf::from("/csi")]
    }

    #[test]
    fn accepts_and_folds() {
        let p = confined("p", "/var/lib/kubelet//pods/x/", &allowed()).unwrap();
        assert_eq!(p.as_path(), Path::new("/var/lib/kubelet/pods/x"));
    }

    #[test]
    fn refuses_bad_shapes() {
        for raw in [
            "",
            "rel/path",
            "/csi/../etc",
            "/csi/./x",
            "/",
            "/etc/passwd",
            "/csi\0x",
        ] {
            assert!(confined("p", raw, &allowed()).is_err(), "{raw:?}");
        }
        assert!(confined("p", "/csix/a", &allowed()).is_err());
        let long = format!("/csi/{}", "a".repeat(MAX_PATH_BYTES));
        assert!(confined("p", &long, &allowed()).is_err());
    }

    #[test]
    fn refuses_symlink_below_prefix() {
        let base = std::env::temp_dir().join(format!("confined-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(base.join("real")).unwrap();
        std::os::unix::fs::symlink("/etc", base.join("link")).unwrap();
        let allowed = vec![base.clone()];
        let ok = confined("p", base.join("real/x").to_str().unwrap(), &allowed);
        let bad = confined("p", base.join("link/x").to_str().unwrap(), &allowed);
        std::fs::remove_dir_all(&base).unwrap();
        assert!(ok.is_ok());
        assert!(bad.is_err());
    }
}
