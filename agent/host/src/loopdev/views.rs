//! Every other device that shows some of a device's bytes (the core's `HostOps::views_of`): the
//! loop devices over the same file (at any offset), the loop devices laid over it or over any of
//! those, the device a loop device is laid over, and the partitions and whole disks of each;
//! closed under the same steps. A mount, a claim, a device-node bind or a holder of any of them
//! is a use of the same bytes, which no check of the device itself sees (fresh reviews 24 to 27:
//! the same filesystem mounted twice read-write, a writable raw device under a mounted one).
//!
//! A loop device over a file that a stacking or remote filesystem shows (overlayfs, FUSE, NFS),
//! or whose status does not come (its backing file hangs), cannot be told apart from any file:
//! when the device is a file's, each such loop device is a view too (a twenty-seventh fresh
//! review's F1 and F2). One scan of the loop devices, bounded in time; nothing more when the
//! device has no other view.

use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use ebs_node_core::DevNum;
use ebs_node_core::node::host::View;

use super::backing_fs::{BackingFs, backing_fs_of_loop};
use super::overlay::decode_dev;
use super::query;
use crate::flight::{Flight, Lead};

/// More views than this are not followed: the call is refused instead (a twenty-seventh fresh
/// review's F3: the walk stopped there and let the call through).
const MOST: usize = 256;
/// Set by the kernel on a loop device whose backing file is not writable.
const LO_FLAGS_READ_ONLY: u32 = 1;

#[derive(Clone)]
struct Loop {
    devnum: DevNum,
    /// The block device it is laid over ((0, 0): a file, or not known).
    over_device: DevNum,
    /// Its backing file (st_dev, st_ino) when that is a file on a filesystem that shows only its
    /// own inodes.
    over_file: Option<(u64, u64)>,
    /// A file on a filesystem that may show another's files, or a status that did not come:
    /// what it shows cannot be told.
    indistinct: bool,
    /// Its backing file (st_dev, st_ino) as the kernel says, trusted or not; `None` over a
    /// device or when its status did not come.
    file: Option<(u64, u64)>,
    /// Its status did not come (`HUNG`) or could not be asked.
    hung: bool,
    read_only: bool,
    name: String,
    /// The bytes of its backing it shows: [offset, end), `u64::MAX` for "to the end".
    range: (u64, u64),
}

impl Loop {
    /// A loop device whose status did not come or cannot be asked: it may show any file's bytes.
    fn unknown(devnum: DevNum) -> Loop {
        Loop {
            devnum,
            over_device: DevNum::new(0, 0),
            over_file: None,
            indistinct: true,
            file: None,
            hung: true,
            read_only: false,
            name: String::new(),
            range: (0, u64::MAX),
        }
    }
}

/// Whether two loop devices over one file show some of the same bytes (two over disjoint ranges
/// of one image, a state file's and a volume's, share none).
fn overlap(a: (u64, u64), b: (u64, u64)) -> bool {
    a.0 < b.1 && b.0 < a.1
}

/// Loop device attachments (device, disk sequence number) whose status did not come within
/// `WITHIN` once (LOOP_GET_STATUS64 stats the backing file: on a stopped FUSE daemon or a dead
/// NFS server it hangs, and every stage with it: a twenty-sixth fresh review's F2). Not asked
/// again while that attachment lasts; counted as indistinct. A new attachment under the same
/// number has another sequence number and is asked afresh (a twenty-seventh review's F2).
static HUNG: Mutex<BTreeSet<(DevNum, String)>> = Mutex::new(BTreeSet::new());
const WITHIN: Duration = Duration::from_secs(2);

/// A walk of the loop devices (`scan_bounded`), or why it failed.
type Walk = Result<Vec<Loop>, (io::ErrorKind, String)>;

static WALKS: Flight<Walk> = Flight::new();

/// Whether what `devnum` shows is told all the way down: no loop device it is, or lies over
/// (through partitions and devices laid over others), is over a file that cannot be told or
/// gave no status. A flush of one that is not may reach a filesystem's server.
fn told_all_the_way(loops: &[Loop], devnum: DevNum) -> bool {
    let mut at = devnum;
    for _ in 0..MOST {
        let whole = crate::raw_use::disk_family(at).0;
        let Some(l) = loops.iter().find(|l| l.devnum == at || l.devnum == whole) else {
            return true;
        };
        if l.indistinct || l.hung {
            return false;
        }
        if l.over_device == DevNum::new(0, 0) {
            return true;
        }
        at = l.over_device;
    }
    false
}

/// The loop devices as a walk started after this call saw them, shared with the callers asking
/// at once (`flight`): every filesystem stage walks them three times (its views, and its raw
/// use before and after the mount), and sixteen stages at once walked 128 devices each time.
fn walked() -> Arc<Walk> {
    let failed = || {
        Err((
            io::ErrorKind::Other,
            "the loop devices could not be walked".into(),
        ))
    };
    let walk = || scan_bounded().map_err(|e| (e.kind(), e.to_string()));
    WALKS
        .look(Lead::Inline, walk, failed)
        .unwrap_or_else(|| Arc::new(failed()))
}

fn loops_in(walk: &Walk) -> io::Result<&[Loop]> {
    walk.as_ref()
        .map(Vec::as_slice)
        .map_err(|(kind, why)| io::Error::new(*kind, why.clone()))
}

/// The other loop devices over the same file as `devnum` whose bytes overlap its own (an
/// operator's second `losetup` of it, another agent's attachment), and every loop device whose
/// status did not come (it may be over that file); empty when `devnum` is a loop device over
/// another device. An error when `devnum`'s own status did not come, or it is no attached loop
/// device (nor a partition of one).
pub fn siblings_of(devnum: DevNum) -> io::Result<Vec<DevNum>> {
    let walk = walked();
    let loops = loops_in(&walk)?;
    // A partition of a loop device (`max_part`) shows its disk's file: the disk is looked up.
    let whole = crate::raw_use::disk_family(devnum).0;
    let Some(own) = loops.iter().find(|l| l.devnum == whole) else {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("{devnum} is no loop device the walk of the loop devices found"),
        ));
    };
    if own.hung {
        return Err(io::Error::other(format!(
            "the status of {devnum} did not come (its backing file hangs?)"
        )));
    }
    let Some(file) = own.file else {
        return Ok(Vec::new());
    };
    Ok(loops
        .iter()
        .filter(|l| l.devnum != devnum && l.devnum != whole)
        .filter(|l| l.hung || (l.file == Some(file) && overlap(l.range, own.range)))
        .map(|l| l.devnum)
        .collect())
}

/// `scan` on a thread of its own, waited for `WITHIN` at most; the attachment that keeps it past
/// that joins `HUNG` and the scan starts again.
fn scan_bounded() -> io::Result<Vec<Loop>> {
    for _ in 0..4 {
        let current: Arc<Mutex<Option<DevNum>>> = Arc::new(Mutex::new(None));
        let (tx, rx) = mpsc::channel();
        let at = Arc::clone(&current);
        std::thread::Builder::new()
            .name("loop-views".into())
            .spawn(move || {
                let _ = tx.send(scan(&at));
            })?;
        match rx.recv_timeout(WITHIN) {
            Ok(found) => return found,
            Err(_) => {
                let stuck = *current.lock().unwrap_or_else(|p| p.into_inner());
                let Some(stuck) = stuck else { break };
                tracing::warn!(device = %stuck, "a loop device's status did not come within 2 s (its backing file hangs?); it counts as a device that may show any file's bytes");
                let attachment = (stuck, disk_seq(stuck));
                HUNG.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(attachment);
            }
        }
    }
    Err(io::Error::new(
        io::ErrorKind::TimedOut,
        "the loop devices' status could not be read within the time allowed",
    ))
}

fn scan(current: &Mutex<Option<DevNum>>) -> io::Result<Vec<Loop>> {
    let table = crate::mount::table::MountTable::read().map_err(io::Error::other)?;
    let mut trusted_fs: HashMap<(u32, u32), bool> = HashMap::new();
    let hung = HUNG.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let mut found = Vec::new();
    // One read for every loop device with bytes to show (a device of no size is not listed):
    // reading sysfs per device cost 20 to 40 µs each here.
    for devnum in bound_loops()? {
        if !hung.is_empty() && hung.contains(&(devnum, disk_seq(devnum))) {
            found.push(Loop::unknown(devnum));
            continue;
        }
        *current.lock().unwrap_or_else(|p| p.into_inner()) = Some(devnum);
        // Removed in between: not a view. One that cannot be opened (no node in this /dev) or
        // asked may show any file's bytes (a fresh review: an operator's loop device that a
        // container's /dev has no node of was no sibling, and was mounted twice).
        let status = match crate::device::open_devnum(devnum) {
            Ok(dev) => query::status(&dev),
            Err(_) if !Path::new(&format!("/sys/dev/block/{devnum}")).exists() => continue,
            Err(_) => Err(nix::errno::Errno::ENODEV),
        };
        let info = match status {
            Ok(Some(info)) => info,
            // Detached in between: not a view.
            Ok(None) => continue,
            Err(_) => {
                found.push(Loop::unknown(devnum));
                continue;
            }
        };
        let lo_name = info
            .lo_file_name
            .split(|b| *b == 0)
            .next()
            .unwrap_or_default();
        let file = (info.lo_rdevice == 0).then_some((info.lo_device, info.lo_inode));
        let trusted = file.is_some_and(|(d, i)| {
            let fs = DevNum::new(
                u32::try_from(nix::sys::stat::major(d)).unwrap_or(u32::MAX),
                u32::try_from(nix::sys::stat::minor(d)).unwrap_or(u32::MAX),
            );
            // Once per filesystem: by the mount table, or (a btrfs subvolume's number, which
            // the table never shows) by the backing file itself.
            *trusted_fs.entry((fs.major, fs.minor)).or_insert_with(|| {
                match table.mounts_of_device(fs.major, fs.minor).next() {
                    Some(m) => super::backing_fs::owns_its_inodes(&m.fs_type),
                    None => matches!(
                        backing_fs_of_loop(devnum, d, i),
                        Ok(BackingFs::OwnsItsInodes)
                    ),
                }
            })
        });
        found.push(Loop {
            devnum,
            over_device: decode_dev(info.lo_rdevice),
            over_file: file.filter(|_| trusted),
            indistinct: file.is_some() && !trusted,
            file,
            hung: false,
            read_only: info.lo_flags & LO_FLAGS_READ_ONLY != 0,
            name: String::from_utf8_lossy(lo_name).into_owned(),
            range: (
                info.lo_offset,
                match info.lo_sizelimit {
                    0 => u64::MAX,
                    n => info.lo_offset.saturating_add(n),
                },
            ),
        });
    }
    Ok(found)
}

/// The bound loop devices: those /proc/partitions lists (whole devices with bytes to show: one
/// read for all), and those it leaves out for having no size yet bound (sysfs shows their `loop`
/// directory): a device over a file at an offset past its end shows nothing until someone who
/// may open it for writing moves its offset back (LOOP_SET_STATUS64 needs no privilege), and it
/// then shows the file's bytes (a thirty-fourth fresh review's F2).
fn bound_loops() -> io::Result<Vec<DevNum>> {
    let text = std::fs::read_to_string("/proc/partitions")?;
    let mut listed = BTreeSet::new();
    let mut found: Vec<DevNum> = text
        .lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let (major, minor, _, name) = (f.next()?, f.next()?, f.next()?, f.next()?);
            let index = name.strip_prefix("loop")?;
            (!index.is_empty() && index.bytes().all(|b| b.is_ascii_digit())).then_some(())?;
            listed.insert(name.to_string());
            Some(DevNum::new(major.parse().ok()?, minor.parse().ok()?))
        })
        .collect();
    let sys_block = Path::new("/sys/block");
    for entry in std::fs::read_dir(sys_block)?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("loop") || listed.contains(&name) {
            continue;
        }
        let dir = sys_block.join(&name);
        if dir.join("loop").exists()
            && let Some(devnum) = read_dev(&dir)
        {
            found.push(devnum);
        }
    }
    Ok(found)
}

/// A device's disk sequence number (a new one at every loop attach), "" where there is none.
fn disk_seq(devnum: DevNum) -> String {
    std::fs::read_to_string(format!("/sys/dev/block/{devnum}/diskseq")).unwrap_or_default()
}

/// The other views of `devnum`, each with its loop name and what uses it (`None`: nothing the
/// host shows). An error when there are more than can be checked.
pub fn views_of(devnum: DevNum) -> io::Result<Vec<View>> {
    let walk = walked();
    let loops = loops_in(&walk)?;
    let mut seen = BTreeSet::from([devnum]);
    let mut queue = vec![devnum];
    let mut files_seen = false;
    let mut indistinct_added = false;
    loop {
        while let Some(d) = queue.pop() {
            for n in next_of(d, loops, &mut files_seen) {
                if seen.insert(n) {
                    queue.push(n);
                }
            }
            if seen.len() > MOST {
                return Err(io::Error::other(format!(
                    "more than {MOST} devices show its bytes; too many to check"
                )));
            }
        }
        // A file's bytes may be shown by any loop device over a file that cannot be told apart.
        if !files_seen || indistinct_added {
            break;
        }
        indistinct_added = true;
        for l in loops.iter().filter(|l| l.indistinct) {
            if seen.insert(l.devnum) {
                queue.push(l.devnum);
            }
        }
    }
    seen.remove(&devnum);
    if seen.is_empty() {
        return Ok(Vec::new());
    }
    let binds = crate::device_binds::Uses::scan(crate::device_binds::WITHIN);
    Ok(seen
        .into_iter()
        .map(|d| {
            let l = loops.iter().find(|l| l.devnum == d);
            View {
                devnum: d,
                name: l.map(|l| l.name.clone()).unwrap_or_default(),
                read_only: l.is_some_and(|l| l.read_only),
                lies_over: l.map(|l| l.over_device).filter(|o| *o != DevNum::new(0, 0)),
                in_use: use_of(d, &binds),
                told: told_all_the_way(loops, d),
            }
        })
        .collect())
}

/// The devices one step from `d`; notes whether `d` is a loop device over a file.
fn next_of(d: DevNum, loops: &[Loop], files_seen: &mut bool) -> Vec<DevNum> {
    let mut next: Vec<DevNum> = loops
        .iter()
        .filter(|l| l.over_device == d)
        .map(|l| l.devnum)
        .collect();
    // A partition shows part of its disk's bytes, a disk all of its partitions': a loop
    // device laid over a partition of a view, or a bind of its node, uses the same bytes (a
    // twenty-sixth fresh review's F1). The disk's other partitions come along (as the
    // node-local door's disk family does): never the same bytes, but never taken apart.
    next.extend(disk_relatives(d));
    if let Some(l) = loops.iter().find(|l| l.devnum == d) {
        if l.over_device != DevNum::new(0, 0) {
            next.push(l.over_device);
        }
        if l.over_file.is_some() || l.indistinct {
            *files_seen = true;
        }
        if let Some(file) = l.over_file {
            next.extend(
                (loops.iter())
                    .filter(|m| m.over_file == Some(file) && overlap(m.range, l.range))
                    .map(|m| m.devnum),
            );
        }
    }
    next
}

fn use_of(d: DevNum, binds: &crate::device_binds::Uses) -> Option<String> {
    if crate::device::still_claimed(d) {
        return Some("mounted or claimed exclusively".into());
    }
    if let Some(at) = binds.bound(d) {
        return Some(format!("its device node is {at}"));
    }
    let holders = format!("/sys/dev/block/{d}/holders");
    std::fs::read_dir(holders)
        .ok()
        .and_then(|mut it| it.next())
        .and_then(|e| e.ok())
        .map(|h| format!("held by {}", h.file_name().to_string_lossy()))
}

fn read_dev(dir: &Path) -> Option<DevNum> {
    std::fs::read_to_string(dir.join("dev"))
        .ok()
        .and_then(|s| DevNum::parse(s.trim()))
}

/// The whole disk of a partition, or the partitions of a whole disk, from sysfs.
fn disk_relatives(d: DevNum) -> Vec<DevNum> {
    let Ok(dir) = std::fs::canonicalize(format!("/sys/dev/block/{d}")) else {
        return Vec::new();
    };
    if dir.join("partition").exists() {
        return dir.parent().and_then(read_dev).into_iter().collect();
    }
    crate::raw_use::partitions_in(&dir)
}

/// Claims each of `device`'s `views` exclusively, so nothing mounts them while the call runs;
/// EBUSY names the one in use.
pub fn hold(device: DevNum, views: &[View]) -> io::Result<Vec<File>> {
    let relatives = disk_relatives(device);
    let mut held = Vec::new();
    for View {
        devnum: d, told, ..
    } in views
    {
        let dev = crate::device::open_devnum(*d)?;
        let named = |e: io::Error| io::Error::new(e.kind(), format!("{d}: {e}"));
        // Writes made through a view may still sit in its own page cache, where no read of the
        // device or of its file sees them, and reach the bytes after the call's blank proof (a
        // fifty-ninth fresh review's F1: a second loop device over the volume's file held a
        // workload's buffered writes; the stage formatted the file, and their writeback then
        // broke the new filesystem). Each is flushed first, as the blank proof flushes the
        // device itself, through a bounded wait: a flush may reach a filesystem's server
        // (`flush`). One whose backing cannot be told (over FUSE, NFS, overlayfs, or its status
        // did not come; a partition of one is asked by its disk: `View::told`, from the walk that
        // found the view) may fail when that server is gone, which lets the take go on.
        super::flush::bounded(*d, &dev, *told).map_err(named)?;
        // The device's own whole disk or partitions: held, they would keep the device itself
        // from being claimed (by the call's own mkfs or mount, or its check that nothing else
        // claims it). They are checked for use all the same.
        if relatives.contains(d) {
            continue;
        }
        let exclusive = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_EXCL)
            .open(format!("/proc/self/fd/{}", dev.as_raw_fd()))
            .map_err(named)?;
        held.push(exclusive);
    }
    Ok(held)
}
