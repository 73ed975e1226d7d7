//! The unix socket we serve on: parsed strictly, bound safely (never two agents on one socket).

use std::io::ErrorKind;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    path: PathBuf,
}

use ebs_node_core::config::unix_socket_path;

impl Endpoint {
    /// CSI allows only unix endpoints; the path must be absolute and end in `.sock`.
    pub fn parse(raw: &str) -> Result<Self, String> {
        let Some(rest) = unix_socket_path(raw) else {
            return Err(format!(
                "endpoint {raw:?} is not supported: use unix:///absolute/path.sock (or \
                 unix:/absolute/path.sock)"
            ));
        };
        let path = PathBuf::from(rest);
        if !path.is_absolute() {
            return Err(format!(
                "endpoint {raw:?}: the socket path must be absolute"
            ));
        }
        if path.extension().is_none_or(|e| e != "sock") {
            return Err(format!(
                "endpoint {raw:?}: the socket path must end in .sock"
            ));
        }
        if rest.len() > 107 {
            return Err(format!(
                "endpoint {raw:?}: the socket path is longer than a unix socket address allows \
                 (107 bytes)"
            ));
        }
        Ok(Endpoint { path })
    }

    pub fn parse_arg(raw: &str) -> Result<Self, String> {
        Self::parse(raw)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn url(&self) -> String {
        format!("unix://{}", self.path.display())
    }

    /// Binds the socket: creates the parent directory, replaces a stale socket file only when
    /// nothing answers on it, refuses a live one, and sets mode 0660.
    pub fn bind(&self) -> Result<tokio::net::UnixListener, String> {
        let path = &self.path;
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
        }
        match std::fs::symlink_metadata(path) {
            Ok(meta) => {
                use std::os::unix::fs::FileTypeExt;
                if !meta.file_type().is_socket() {
                    return Err(format!(
                        "{} exists and is not a socket; refusing to replace it",
                        path.display()
                    ));
                }
                match std::os::unix::net::UnixStream::connect(path) {
                    Ok(_) => {
                        return Err(format!(
                            "another process is already serving on {}; two agents must not share \
                             one socket",
                            path.display()
                        ));
                    }
                    Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
                        std::fs::remove_file(path).map_err(|e| {
                            format!("cannot remove stale socket {}: {e}", path.display())
                        })?;
                    }
                    Err(e) => {
                        return Err(format!(
                            "cannot tell whether {} is in use: {e}",
                            path.display()
                        ));
                    }
                }
            }
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(format!("cannot inspect {}: {e}", path.display())),
        }
        let listener = tokio::net::UnixListener::bind(path)
            .map_err(|e| format!("cannot bind {}: {e}", path.display()))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
            .map_err(|e| format!("cannot set the mode of {}: {e}", path.display()))?;
        Ok(listener)
    }

    /// Removes our socket file on shutdown.
    pub fn remove(&self) {
        if let Err(e) = std::fs::remove_file(&self.path)
            && e.kind() != ErrorKind::NotFound
        {
            tracing::warn!(path = %self.path.display(), error = %e, "could not remove the socket");
        }
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.url())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_only_unix_sock_urls() {
        assert!(Endpoint::parse("unix:///run/x/csi.sock").is_ok());
        // The upstream chart's spelling, one slash: the same socket.
        let one = Endpoint::parse("unix:/csi/csi.sock").unwrap();
        assert_eq!(one.path(), Path::new("/csi/csi.sock"));
        assert_eq!(one.url(), "unix:///csi/csi.sock");
        for bad in [
            "tcp://127.0.0.1:10000",
            "unix://relative.sock",
            "unix:///run/x/csi",
            "/run/csi.sock",
            "unix:///",
            "unix:csi.sock",
            "unix:",
            "unix://host/csi.sock",
        ] {
            assert!(Endpoint::parse(bad).is_err(), "{bad}");
        }
    }
}
