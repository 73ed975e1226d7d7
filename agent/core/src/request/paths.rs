//! Paths handed to us by the CO. At the door they become `RequestPath`: absolute, normalised,
//! strictly below an allowed prefix, never a prefix itself nor an ancestor of one, and clear of
//! the agent's own directories. Those checks need no host access; the rest (no symlink on the
//! way, nothing swapped between check and use) happens when the host work resolves the path
//! through file descriptors (`host::anchor`), off the async executor.

use std::path::{Component, Path, PathBuf};
use std::sync::OnceLock;

use super::ValidationError;
use crate::node::host::Place;

/// Linux PATH_MAX: the spec asks us to accept the OS maximum.
pub const MAX_PATH_BYTES: usize = 4096;

/// Where request paths may lie, and the agent's own directories, where they may not.
#[derive(Clone, Debug, Default)]
pub struct Roots {
    /// Staging and target paths lie strictly below one of these.
    pub allowed: Vec<PathBuf>,
    /// The state directory and the sockets' directories: never a staging or target path, nor
    /// inside or above one of them.
    pub reserved: Vec<PathBuf>,
    /// The reserved directories as places (device and inode), noted once: a second name of one
    /// (a bind of the socket directory below the allowed prefix) is the same directory.
    places: OnceLock<Vec<(PathBuf, Place)>>,
}

impl Roots {
    pub fn new(allowed: Vec<PathBuf>, reserved: Vec<PathBuf>) -> Self {
        Roots {
            allowed,
            reserved,
            places: OnceLock::new(),
        }
    }

    /// Notes what each reserved directory is (at start-up, or at the first path resolved); one
    /// that cannot be examined is said once and left to the lexical rule.
    pub fn record_places(&self, place_of: impl Fn(&Path) -> std::io::Result<Place>) {
        self.reserved_places(place_of);
    }

    /// The reserved directories' places, noted on the first call.
    pub fn reserved_places(
        &self,
        place_of: impl Fn(&Path) -> std::io::Result<Place>,
    ) -> &[(PathBuf, Place)] {
        self.places.get_or_init(|| {
            self.reserved
                .iter()
                .filter_map(|dir| match place_of(dir) {
                    Ok(place) => Some((dir.clone(), place)),
                    Err(e) => {
                        tracing::warn!(dir = %dir.display(), error = %e,
                            "the agent's own directory cannot be examined; only its name is refused");
                        None
                    }
                })
                .collect()
        })
    }
}

/// A request path that passed the lexical checks, with the allowed prefix it lies below.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestPath {
    field: &'static str,
    path: PathBuf,
    prefix: PathBuf,
}

impl RequestPath {
    pub fn parse(field: &'static str, raw: &str, roots: &Roots) -> Result<Self, ValidationError> {
        let path = normalise(field, raw)?;
        let refuse = |why: &'static str| ValidationError::BadPath {
            field,
            path: path.clone(),
            why,
        };
        if roots.allowed.iter().any(|p| p.starts_with(&path)) {
            return Err(refuse(
                "it is an allowed path prefix itself, or lies above one: a volume mounted there \
                 would cover every path below it",
            ));
        }
        // Inside a reserved directory only below an allowed prefix that lies inside it: the
        // agent's own v0.1 staging directory within the state directory.
        let carved_out = |r: &PathBuf| {
            roots
                .allowed
                .iter()
                .any(|p| p.starts_with(r) && p != r && path.starts_with(p))
        };
        if roots
            .reserved
            .iter()
            .any(|r| r.starts_with(&path) || (path.starts_with(r) && !carved_out(r)))
        {
            return Err(refuse(
                "it is, holds, or lies inside the agent's own state or socket directory",
            ));
        }
        let prefix = roots
            .allowed
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

    /// A path the agent chose itself below a directory it owns (v0.1's internal staging).
    pub fn internal(field: &'static str, prefix: PathBuf, path: PathBuf) -> Self {
        RequestPath {
            field,
            path,
            prefix,
        }
    }

    pub fn as_path(&self) -> &Path {
        &self.path
    }

    pub fn prefix(&self) -> &Path {
        &self.prefix
    }

    pub fn field(&self) -> &'static str {
        self.field
    }
}

impl AsRef<Path> for RequestPath {
    fn as_ref(&self) -> &Path {
        &self.path
    }
}

impl std::fmt::Display for RequestPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.path.display().fmt(f)
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

/// Parses the operator's `--allowed-path-prefix` values (absolute, normalised).
pub fn parse_prefix(raw: &str) -> Result<PathBuf, ValidationError> {
    normalise("allowed-path-prefix", raw)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roots() -> Roots {
        Roots::new(
            vec![
                PathBuf::from("/var/lib/kubelet"),
                PathBuf::from("/csi"),
                PathBuf::from("/a"),
                PathBuf::from("/a/b"),
            ],
            vec![PathBuf::from("/var/lib/kubelet/ebs-state")],
        )
    }

    fn parse(raw: &str) -> Result<RequestPath, ValidationError> {
        RequestPath::parse("p", raw, &roots())
    }

    #[test]
    fn accepts_and_folds() {
        let p = parse("/var/lib/kubelet//pods/x/").unwrap();
        assert_eq!(p.as_path(), Path::new("/var/lib/kubelet/pods/x"));
        assert_eq!(p.prefix(), Path::new("/var/lib/kubelet"));
        assert_eq!(parse("/a/b/c").unwrap().prefix(), Path::new("/a/b"));
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
            "/csix/a",
        ] {
            assert!(parse(raw).is_err(), "{raw:?}");
        }
        let long = format!("/csi/{}", "a".repeat(MAX_PATH_BYTES));
        assert!(parse(&long).is_err());
    }

    #[test]
    fn a_prefix_or_an_ancestor_of_one_is_never_a_path() {
        for raw in ["/var/lib/kubelet", "/csi", "/a", "/a/b", "/var/lib", "/var"] {
            let e = parse(raw).unwrap_err();
            assert!(
                matches!(e, ValidationError::BadPath { .. }),
                "{raw:?}: {e:?}"
            );
        }
    }

    #[test]
    fn an_allowed_prefix_inside_the_state_directory_is_carved_out() {
        let roots = Roots::new(
            vec![PathBuf::from("/csi"), PathBuf::from("/state/v01-staging")],
            vec![PathBuf::from("/state")],
        );
        assert!(RequestPath::parse("p", "/state/v01-staging/vol-1", &roots).is_ok());
        assert!(RequestPath::parse("p", "/state/state.redb", &roots).is_err());
        assert!(RequestPath::parse("p", "/state/v01-staging", &roots).is_err());
    }

    #[test]
    fn the_agents_own_directories_are_never_paths() {
        for raw in [
            "/var/lib/kubelet/ebs-state",
            "/var/lib/kubelet/ebs-state/volumes/x",
        ] {
            assert!(parse(raw).is_err(), "{raw:?}");
        }
        assert!(parse("/var/lib/kubelet/ebs-state-not").is_ok());
    }
}
