//! The agent's own files are private to root: the state directory and the loop backend's
//! directories are 0700, the state file and every volume image 0600, whatever the umask and
//! whatever mode an older agent, a packaging step (a hostPath `DirectoryOrCreate` is 0755) or an
//! operator left them with. A volume image holds the volume's bytes, so a world-readable one
//! hands every file in it to any local user, whatever mode the file has inside the volume; the
//! state file names paths, UUIDs and devices.
//!
//! Files are created with the private mode and then fchmod-ed through the handle (an existing
//! file opened without O_EXCL keeps its mode otherwise); existing ones are tightened at start,
//! one log line each. Files are never reached through a symlink.

use std::fs::{DirBuilder, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// The mode of the agent's directories.
pub const DIR_MODE: u32 = 0o700;
/// The mode of the agent's files.
pub const FILE_MODE: u32 = 0o600;

/// Creates `dir` (its missing parents with the usual modes) and makes it 0700.
pub fn ensure_dir(dir: &Path) -> io::Result<()> {
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    match DirBuilder::new().mode(DIR_MODE).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    tighten(dir, Kind::Dir).map(drop)
}

/// Opens `path` for writing, creating it 0600 if missing, and makes it 0600 if it was not.
pub fn open_file(path: &Path, options: &mut OpenOptions) -> io::Result<File> {
    let file = options
        .mode(FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    make_private(&file, FILE_MODE)?;
    Ok(file)
}

/// Makes an existing regular file 0600 (a file another library created, such as the state file).
pub fn restrict_file(path: &Path) -> io::Result<()> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)?;
    make_private(&file, FILE_MODE)
}

/// Makes an open file or directory private (owner bits only), if it is not already.
pub fn make_private(file: &File, mode: u32) -> io::Result<()> {
    if file.metadata()?.mode() & 0o7777 != mode {
        file.set_permissions(std::fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Dir,
    File,
}

/// Takes the group's and others' bits off `path` (a directory or a regular file). Returns the
/// old mode when it changed anything. A directory is the operator's choice (the state directory
/// or its `volumes` may be a symlink to a larger disk) and is followed; a file never is.
fn tighten(path: &Path, kind: Kind) -> io::Result<Option<u32>> {
    let flags = libc::O_CLOEXEC
        | libc::O_NONBLOCK
        | match kind {
            Kind::Dir => libc::O_DIRECTORY,
            Kind::File => libc::O_NOFOLLOW,
        };
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(flags)
        .open(path)?;
    let meta = file.metadata()?;
    let is_kind = match kind {
        Kind::Dir => meta.is_dir(),
        Kind::File => meta.is_file(),
    };
    let mode = meta.mode() & 0o7777;
    if !is_kind || mode & 0o077 == 0 {
        return Ok(None);
    }
    file.set_permissions(std::fs::Permissions::from_mode(mode & 0o700))?;
    Ok(Some(mode))
}

/// Tightens the state directory at start: itself, the files directly in it (the state file,
/// files set aside), the loop backend's volume and snapshot directories and the images in them.
/// Never below: the v0.1 staging directory holds mount points of volumes. Returns how many
/// things it tightened; one log line each.
pub fn tighten_state_dir(state_dir: &Path) -> io::Result<usize> {
    let mut tightened = 0;
    let mut one = |path: &Path, kind: Kind| match tighten(path, kind) {
        Ok(Some(old)) => {
            let new = old & 0o700;
            tracing::warn!(path = %path.display(), from = format!("{old:04o}"),
                to = format!("{new:04o}"), "private state: group and others' access removed");
            tightened += 1;
        }
        Ok(None) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        // A symlinked file (ELOOP) or something else we cannot open is left alone, and said so.
        Err(e) => tracing::warn!(path = %path.display(), error = %e,
            "private state: could not check the permissions"),
    };
    let dirs =
        std::iter::once(state_dir.to_path_buf()).chain(LOOP_DIRS.iter().map(|d| state_dir.join(d)));
    for dir in dirs {
        one(&dir, Kind::Dir);
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        for entry in entries.flatten() {
            // Regular files only (file_type does not follow a symlink).
            if entry.file_type().is_ok_and(|t| t.is_file()) {
                one(&entry.path(), Kind::File);
            }
        }
    }
    Ok(tightened)
}

/// The loop backend's directories below the state directory (volume images, snapshots).
pub const LOOP_DIRS: [&str; 2] = ["volumes", "snapshots"];

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
    }

    #[test]
    fn loose_modes_are_tightened_and_symlinked_files_never_followed() {
        let dir = std::env::temp_dir().join(format!("ebs-private-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let state = dir.join("state");
        std::fs::create_dir_all(state.join("volumes")).unwrap();
        let set = |p: &Path, m: u32| std::fs::set_permissions(p, PermissionsExt::from_mode(m));
        set(&state, 0o755).unwrap();
        set(&state.join("volumes"), 0o777).unwrap();
        std::fs::write(state.join("state.redb"), b"x").unwrap();
        set(&state.join("state.redb"), 0o644).unwrap();
        std::fs::write(state.join("volumes/lv-1.img"), b"x").unwrap();
        set(&state.join("volumes/lv-1.img"), 0o666).unwrap();
        // A file outside, reached through a symlink inside: never changed.
        std::fs::write(dir.join("outside"), b"x").unwrap();
        set(&dir.join("outside"), 0o644).unwrap();
        std::os::unix::fs::symlink(dir.join("outside"), state.join("volumes/link.img")).unwrap();
        // The snapshots directory on another disk, through a symlink: followed.
        std::fs::create_dir(dir.join("elsewhere")).unwrap();
        set(&dir.join("elsewhere"), 0o755).unwrap();
        std::os::unix::fs::symlink(dir.join("elsewhere"), state.join("snapshots")).unwrap();

        assert_eq!(tighten_state_dir(&state).unwrap(), 5);
        assert_eq!(mode(&dir.join("elsewhere")), 0o700);
        assert_eq!(mode(&state), 0o700);
        assert_eq!(mode(&state.join("volumes")), 0o700);
        assert_eq!(mode(&state.join("state.redb")), 0o600);
        assert_eq!(mode(&state.join("volumes/lv-1.img")), 0o600);
        assert_eq!(mode(&dir.join("outside")), 0o644);
        assert_eq!(tighten_state_dir(&state).unwrap(), 0, "nothing left to do");

        // Created files are private whatever mode an existing one had.
        let f = state.join("volumes/lv-2.img");
        std::fs::write(&f, b"").unwrap();
        set(&f, 0o644).unwrap();
        open_file(&f, OpenOptions::new().write(true).create(true)).unwrap();
        assert_eq!(mode(&f), 0o600);
        ensure_dir(&state.join("clones")).unwrap();
        assert_eq!(mode(&state.join("clones")), 0o700);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
