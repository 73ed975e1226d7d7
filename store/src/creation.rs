//! How the state file comes into being, and what a file at its name may be before redb opens it.
//!
//! redb takes an empty file for a new database and initialises it. So an existing state file
//! cut to 0 bytes (a bad restore, `> state.redb`, a filesystem that lost the file's blocks)
//! would start an agent ready and with no volumes, forgetting every staged volume. The agent
//! therefore never creates the file at its name: it creates `<name>.creating`, commits the
//! schema, makes the file durable, and only then gives it its name (a hard link, which never
//! replaces a file another start made meanwhile). A file at the state file's name is then always
//! whole, and an empty or headerless one is damage, refused like any other corruption. A power
//! cut during the first start leaves only `<name>.creating`, which the next start sets aside
//! (kept, never deleted) and makes again.

use std::io::{ErrorKind, Read};
use std::path::{Path, PathBuf};

use crate::StoreError;

/// What a file at the state file's name shows, before redb is asked to open it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Shape {
    /// 0 bytes.
    Empty,
    /// Every byte zero: no header at all.
    NoHeader,
    /// What an older agent, which created the file in place, left when a power cut stopped its
    /// first start. redb sizes a new file, writes its header without the magic number, flushes,
    /// and only then writes the magic number; nothing is committed before that. So a header
    /// without the magic number, and every page past the header page zero, never held a record.
    /// (A committed file that lost its magic number has data pages, and stays refused.)
    CreationCutShort,
    /// Not a regular file (a FIFO, a device, a directory: a read of it may never end), or larger
    /// than any state file the agent writes.
    NotAFile(String),
    /// Anything else: redb decides (and refuses what is damaged).
    Other,
}

/// The most a state file may hold: its tables are bounded (issue 41) to a few megabytes; a
/// file far beyond that is not one the agent wrote, and a copy of it would fill a tmpfs.
pub(crate) const MAX_STATE_BYTES: u64 = 1 << 30;

/// Opens the file at the state file's name for reading, without blocking on a FIFO, only if it
/// is a regular file the agent could have written: `Err` says why not (a fifty-seventh fresh
/// review's F4: a FIFO there hung `status`, `/dev/zero` hung it too, `/dev/urandom` filled
/// /tmp with its copy).
pub(crate) fn open_regular(path: &Path) -> std::io::Result<Result<std::fs::File, String>> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
        .open(path)?;
    let meta = file.metadata()?;
    let kind = meta.file_type();
    let what = if kind.is_file() {
        if meta.len() > MAX_STATE_BYTES {
            return Ok(Err(format!(
                "it holds {} bytes, more than any state file ({MAX_STATE_BYTES})",
                meta.len()
            )));
        }
        return Ok(Ok(file));
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_block_device() || kind.is_char_device() {
        "a device"
    } else if kind.is_dir() {
        "a directory"
    } else {
        "not a regular file"
    };
    Ok(Err(format!("it is {what}, not a regular file")))
}

const MAGIC_LEN: usize = 9;
const HEADER_PAGE: usize = 4096;

pub(crate) fn shape(path: &Path) -> Shape {
    let mut f = match open_regular(path) {
        Ok(Ok(f)) => f,
        Ok(Err(why)) => return Shape::NotAFile(why),
        Err(_) => return Shape::Other,
    };
    let mut buf = vec![0u8; 64 << 10];
    let mut seen = 0usize;
    let mut header = false;
    loop {
        let n = match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(_) => return Shape::Other,
        };
        let zero = |from: usize, to: usize| buf[from.min(n)..to.min(n)].iter().all(|b| *b == 0);
        let rest_zero = if seen == 0 {
            header = !zero(MAGIC_LEN, HEADER_PAGE);
            zero(0, MAGIC_LEN) && zero(HEADER_PAGE, n)
        } else {
            zero(0, n)
        };
        if !rest_zero {
            return Shape::Other;
        }
        seen += n;
    }
    match (seen, header) {
        (0, _) => Shape::Empty,
        (_, false) => Shape::NoHeader,
        (_, true) => Shape::CreationCutShort,
    }
}

/// Why a file of this shape is refused as corrupt; `None` when it is not.
pub(crate) fn refusal(path: &Path, shape: &Shape) -> Option<StoreError> {
    let detail = match shape {
        Shape::Empty => "it is empty (0 bytes)",
        Shape::NoHeader => "it has no header: every byte is zero",
        Shape::NotAFile(why) => {
            return Some(StoreError::Corrupt {
                path: path.to_path_buf(),
                detail: format!("{why}; the agent writes its state file as a regular file"),
            });
        }
        Shape::CreationCutShort | Shape::Other => return None,
    };
    Some(StoreError::Corrupt {
        path: path.to_path_buf(),
        detail: format!(
            "{detail}; the agent only ever gives a whole file this name, so its records were lost"
        ),
    })
}

/// Where the state file is made before it gets its name.
pub(crate) fn creating_name(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".creating");
    path.with_file_name(name)
}

/// Moves `file`, left by a creation that was cut short, aside next to the state file `path`
/// (kept, never deleted).
pub(crate) fn set_aside(file: &Path, path: &Path) -> Result<(), StoreError> {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".unfinished-{}", crate::now_unix_ms()));
    let aside = path.with_file_name(name);
    std::fs::rename(file, &aside).map_err(|e| StoreError::Corrupt {
        path: path.to_path_buf(),
        detail: format!(
            "its creation was cut short, and moving {} aside failed: {e}",
            file.display()
        ),
    })?;
    tracing::warn!(path = %path.display(), left = %file.display(), aside = %aside.display(),
        "the state file's creation was cut short (power loss or kill during the first start); it held no records: set aside, starting afresh");
    Ok(())
}

/// Makes the state file at `path` (which does not exist): whole, with its schema, durable, then
/// named. Another start that named its own file first wins; this one's is removed.
pub(crate) fn create_whole(path: &Path) -> Result<(), StoreError> {
    let creating = creating_name(path);
    if std::fs::symlink_metadata(&creating).is_ok() {
        set_aside(&creating, path)?;
    }
    let failed = |what: &str, e: &dyn std::fmt::Display| StoreError::Corrupt {
        path: path.to_path_buf(),
        detail: format!("creating it: {what} {}: {e}", creating.display()),
    };
    {
        let db = redb::Database::builder()
            .create(&creating)
            .map_err(|e| StoreError::open(&creating, e))?;
        let tx = db.begin_write()?;
        crate::writer::init_schema(&tx, crate::SCHEMA_VERSION)?;
        tx.commit()?;
    }
    std::fs::File::open(&creating)
        .and_then(|f| f.sync_all())
        .map_err(|e| failed("syncing", &e))?;
    match std::fs::hard_link(&creating, path) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
        // A filesystem without hard links: a rename names it as well (it could replace a file
        // another start named in the last instant, which the link would not).
        Err(e)
            if matches!(
                e.kind(),
                ErrorKind::Unsupported | ErrorKind::PermissionDenied
            ) =>
        {
            std::fs::rename(&creating, path).map_err(|e| failed("naming", &e))?;
        }
        Err(e) => return Err(failed("naming", &e)),
    }
    match std::fs::remove_file(&creating) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => return Err(failed("removing", &e)),
    }
    sync_parent(path).map_err(|e| failed("syncing the directory of", &e))
}

/// A `<name>.creating` left beside an existing state file: the same file (a stop between the
/// naming and the removal) is removed, another one set aside.
pub(crate) fn tidy_creating(path: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::MetadataExt;
    let creating = creating_name(path);
    let Ok(left) = std::fs::symlink_metadata(&creating) else {
        return Ok(());
    };
    let same =
        std::fs::metadata(path).is_ok_and(|m| (m.dev(), m.ino()) == (left.dev(), left.ino()));
    if same {
        let _ = std::fs::remove_file(&creating);
        return Ok(());
    }
    set_aside(&creating, path)
}

fn sync_parent(path: &Path) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::File::open(dir)?.sync_all()
}
