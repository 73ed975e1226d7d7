//! Other devices showing a volume's bytes ("views") may hold writes in their own page caches,
//! which no read of the device or its file sees: the stage flushes the views known to show its
//! volume's bytes before the blank proof (a fifty-ninth fresh review's F1). A loop device an
//! operator laid over a file of a FUSE filesystem shows bytes the agent cannot tell (FUSE may
//! show any file), so it is a view of every volume's bytes; its flush would be a request to the
//! FUSE server, with no bound, and a server that never answers it hung every stage on the node
//! (a sixtieth fresh review's F1): it is not flushed.

use csi::volume_capability::access_mode::Mode;
use ebs_tests::csi_req::*;
use ebs_tests::*;
use tonic::Code;

use super::owners::{DetachOnDrop, SIZE};

/// A FUSE server of one file, `img`, that answers everything a loop device needs, and FSYNC too
/// until the file named by its second argument exists (then never, as a stopped daemon or an
/// unreachable NFS server would not). With a third argument, `img` passes through to that file
/// (reads, writes and fsync), as a passthrough filesystem shows another's files; without, it is
/// 16 MiB of its own memory.
const SERVER: &str = r#"
import os, sys, struct, ctypes, errno
mnt = sys.argv[1]; hang = sys.argv[2]
back = os.open(sys.argv[3], os.O_RDWR) if len(sys.argv) > 3 else None
SIZE = os.fstat(back).st_size if back is not None else 16 << 20
data = bytearray(0 if back is not None else SIZE)
fd = os.open('/dev/fuse', os.O_RDWR)
libc = ctypes.CDLL(None, use_errno=True)
opts = f"fd={fd},rootmode=40000,user_id=0,group_id=0,allow_other".encode()
if libc.mount(b"ebs-it-fuse-view", mnt.encode(), b"fuse", 0x6, opts) != 0:
    raise OSError(ctypes.get_errno(), "mount")
print("mounted", flush=True)
def attr(ino):
    if ino == 1:
        return struct.pack('<QQQQQQIIIIIIIIII', 1, 0, 0, 0, 0, 0, 0, 0, 0, 0o40755, 2, 0, 0, 0, 4096, 0)
    return struct.pack('<QQQQQQIIIIIIIIII', 2, SIZE, SIZE // 512, 0, 0, 0, 0, 0, 0, 0o100600, 1, 0, 0, 0, 4096, 0)
def reply(unique, err=0, body=b''):
    os.write(fd, struct.pack('<IiQ', 16 + len(body), -err if err else 0, unique) + body)
while True:
    try:
        buf = os.read(fd, 1 << 21)
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.EINTR):
            continue
        break
    ln, op, unique, nodeid = struct.unpack_from('<IIQQ', buf, 0)
    arg = buf[40:ln]
    if op == 26:
        major, minor, ra, flags = struct.unpack_from('<IIII', arg)
        reply(unique, 0, struct.pack('<IIIIHHIIHHI', 7, 31, ra, 0, 16, 12, 131072, 1, 32, 0, 0) + b'\0' * 28)
    elif op == 1:
        if arg.split(b'\0')[0] == b'img':
            reply(unique, 0, struct.pack('<QQQQII', 2, 0, 1, 1, 0, 0) + attr(2))
        else:
            reply(unique, errno.ENOENT)
    elif op == 3:
        reply(unique, 0, struct.pack('<QII', 1, 0, 0) + attr(nodeid))
    elif op in (14, 27):
        reply(unique, 0, struct.pack('<QIi', 0, 0, 0))
    elif op == 15:
        fh, off, size = struct.unpack_from('<QQI', arg)
        got = os.pread(back, size, off) if back is not None else bytes(data[off:off + size])
        reply(unique, 0, got)
    elif op == 16:
        fh, off, size = struct.unpack_from('<QQI', arg)
        if back is not None:
            os.pwrite(back, arg[40:40 + size], off)
        else:
            data[off:off + size] = arg[40:40 + size]
        reply(unique, 0, struct.pack('<II', size, 0))
    elif op == 20:
        if not os.path.exists(hang):
            if back is not None:
                os.fsync(back)
            reply(unique, 0)
    elif op in (25, 18, 29):
        reply(unique, 0)
    elif op in (2, 42):
        continue
    elif op == 38:
        break
    else:
        reply(unique, errno.ENOSYS)
"#;

/// Unmounts lazily on drop (a FUSE mount whose server is gone).
struct Lazily(std::path::PathBuf);

impl Drop for Lazily {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// The FUSE server at `scratch/fuse` (passing through to `backing`, if any), its mount and an
/// operator's loop device over its `img`. Dropped in reverse: the server first (its connection
/// aborts, and a flush waiting on it fails), then the loop device, then the mount.
struct FuseView {
    /// Loop devices laid over `loop_device` (`lay_over`), detached first.
    laid_over: Vec<DetachOnDrop>,
    pub loop_device: DetachOnDrop,
    _mount: Lazily,
    server: Option<Reaped>,
    hang: std::path::PathBuf,
}

impl FuseView {
    fn new(scratch: &Scratch, backing: Option<&std::path::Path>) -> FuseView {
        let mnt = scratch.join("fuse");
        let hang = scratch.join("hang");
        std::fs::create_dir_all(&mnt).expect("the FUSE mount point");
        let mount = Lazily(mnt.clone());
        let mut args = vec![
            "-c".to_string(),
            SERVER.to_string(),
            mnt.display().to_string(),
            hang.display().to_string(),
        ];
        args.extend(backing.map(|b| b.display().to_string()));
        let mut server = std::process::Command::new("python3")
            .args(&args)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("the FUSE server");
        let out = server.stdout.take().expect("its stdout");
        let mut line = String::new();
        let _ = std::io::BufRead::read_line(&mut std::io::BufReader::new(out), &mut line);
        let server = Reaped(server);
        assert_eq!(line.trim(), "mounted", "the FUSE server did not mount");
        // At a high number, so that a loop device laid over it (`lay_over`) takes a lower one
        // and is held and flushed first (the sixty-second review's order).
        let high = (200..400)
            .find(|n| !std::path::Path::new(&format!("/sys/block/loop{n}/loop")).exists())
            .expect("a free loop device number");
        let img = mnt.join("img");
        sh(&format!("losetup /dev/loop{high} {}", img.display()));
        let loop_device = DetachOnDrop(format!("/dev/loop{high}"));
        FuseView {
            laid_over: Vec::new(),
            loop_device,
            _mount: mount,
            server: Some(server),
            hang,
        }
    }

    /// A loop device laid over the FUSE file's loop device (it looks told: it lies over a block
    /// device), whose flush reaches the server all the same.
    fn lay_over(&mut self) {
        let over = super::losetup("", &self.loop_device.0);
        self.laid_over.push(DetachOnDrop(over));
    }

    /// From now on the server never answers FSYNC.
    fn stop_answering_fsync(&self) {
        std::fs::write(&self.hang, b"").expect("the hang flag");
    }

    /// The server dies: its connection aborts, and a flush waiting on it fails.
    fn kill_server(&mut self) {
        drop(self.server.take());
    }
}

impl Drop for FuseView {
    fn drop(&mut self) {
        self.kill_server();
    }
}

/// A workload's buffered writes at 0 and 8 MiB through `device`, left in its page cache: the
/// device stays open (its last close would flush them) until the writer is dropped.
fn buffered_writer(scratch: &Scratch, device: &str) -> Reaped {
    let ready = scratch.join("written");
    let writer = std::process::Command::new("python3")
        .args([
            "-c",
            "import os,sys,time\n\
             fd=os.open(sys.argv[1],os.O_WRONLY)\n\
             for off in (0, 8<<20): os.pwrite(fd, b'USERDATA'*512, off)\n\
             open(sys.argv[2],'w').close()\n\
             time.sleep(600)",
            device,
            &ready.display().to_string(),
        ])
        .spawn()
        .expect("the writer");
    let writer = Reaped(writer);
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !ready.exists() && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(ready.exists(), "the writer did not write");
    writer
}

/// A stage of `v` at its own staging path, answered within 15 s (never hung).
async fn stage_within(
    agent: &Agent,
    v: &Vol,
    staging: &std::path::Path,
) -> Result<(), tonic::Status> {
    let mut node = agent.node().await;
    let cap = mount_cap("ext4", Mode::SingleNodeWriter);
    let stage = node.node_stage_volume(stage_req(v, staging, cap));
    let answered = tokio::time::timeout(std::time::Duration::from_secs(15), stage).await;
    answered
        .expect("the stage hung on the FUSE server's flush")
        .map(drop)
}

/// The server stops answering FSYNC: a stage is refused (its view that may show the volume's
/// bytes cannot be flushed), never hung, and so is the next at once; once the server is gone,
/// a stage goes through (nothing of that cache can reach any file any more).
#[tokio::test]
async fn an_operators_loop_device_over_an_unanswering_fuse_file_holds_up_no_stage() {
    // Alone: a loop device over a FUSE file is a view of every volume's bytes, and while its
    // server does not answer every other test's stage would be refused.
    let _alone = crate::NAMESPACE_COPY.write().await;
    if !require_root("an_operators_loop_device_over_an_unanswering_fuse_file_holds_up_no_stage") {
        return;
    }
    let scratch = Scratch::new("node-local-fuse-view");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let mut fuse = FuseView::new(&scratch, None);
    // And one laid over it, which looks told (a sixty-second fresh review's F1: its plain flush
    // hung every stage).
    fuse.lay_over();
    fuse.stop_answering_fsync();
    let v = create_attached(&agent, "beside-fuse", SIZE).await;
    let staging = agent.work.join("beside-fuse/staging");
    for attempt in ["first", "second"] {
        let e = stage_within(&agent, &v, &staging)
            .await
            .expect_err("staged past a view it could not flush");
        assert_eq!(e.code(), Code::FailedPrecondition, "{attempt}: {e:?}");
        assert!(e.message().contains("flush"), "{attempt}: {e:?}");
        assert!(!super::is_mounted(&staging), "{attempt}: staged anyway");
    }
    fuse.kill_server();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match stage_within(&agent, &v, &staging).await {
            Ok(()) => break,
            Err(e) if std::time::Instant::now() < until => {
                let _ = e;
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            Err(e) => panic!("not staged once the server was gone: {e:?}"),
        }
    }
    assert!(super::is_mounted(&staging), "not staged");
    agent
        .node()
        .await
        .node_unstage_volume(unstage_req(&v, &staging))
        .await
        .expect("unstage");
    drop(fuse);
}

/// An operator's loop device over a FUSE file that passes through to the volume's own file holds
/// a workload's buffered writes in its page cache: the stage flushes it too (its backing cannot
/// be told, so through the bounded wait), sees the data, and formats nothing (a sixty-first
/// fresh review's F1: such a view was skipped, formatted over, and its writeback broke the new
/// filesystem).
#[tokio::test]
async fn a_fuse_passthrough_view_of_the_volume_is_flushed_before_the_blank_proof() {
    // Alone: a loop device over a FUSE file is a view of every volume's bytes, and while its
    // server does not answer every other test's stage would be refused.
    let _alone = crate::NAMESPACE_COPY.write().await;
    if !require_root("a_fuse_passthrough_view_of_the_volume_is_flushed_before_the_blank_proof") {
        return;
    }
    let scratch = Scratch::new("node-local-fuse-passthrough");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let v = create_attached(&agent, "passed", SIZE).await;
    let img = agent
        .state_dir
        .join("volumes")
        .join(format!("{}.img", v.id));
    let fuse = FuseView::new(&scratch, Some(&img));
    let _writer = buffered_writer(&scratch, &fuse.loop_device.0);
    let staging = agent.work.join("passed/staging");
    let e = stage_within(&agent, &v, &staging)
        .await
        .expect_err("formatted over a passthrough view's unwritten data");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("not blank"), "{e:?}");
    assert!(!super::is_mounted(&staging), "staged anyway");
    assert!(
        !agent.log_text().contains(" formatted"),
        "{}",
        agent.log_text()
    );
    let head = std::fs::read(&img).expect("the volume file");
    assert_eq!(&head[..8], b"USERDATA", "the workload's bytes");
    drop(fuse);
}

/// A second loop device over a loop volume's file holds a workload's buffered writes in its own
/// page cache, its file still open: the stage flushes every view of the bytes before the blank
/// proof, sees the data, and formats nothing (a fifty-ninth fresh review's F1: the stage
/// formatted the file, and the writes' later writeback broke the new filesystem).
#[tokio::test]
async fn a_view_holding_unwritten_data_is_flushed_before_the_blank_proof() {
    let _shared = crate::NAMESPACE_COPY.read().await;
    if !require_root("a_view_holding_unwritten_data_is_flushed_before_the_blank_proof") {
        return;
    }
    let scratch = Scratch::new("node-local-dirty-view");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let v = create_attached(&agent, "dirty", SIZE).await;
    let img = agent
        .state_dir
        .join("volumes")
        .join(format!("{}.img", v.id));
    let second = DetachOnDrop(super::losetup("", img.display()));
    let _writer = buffered_writer(&scratch, &second.0);
    let staging = agent.work.join("dirty/staging");
    let e = agent
        .node()
        .await
        .node_stage_volume(stage_req(
            &v,
            &staging,
            mount_cap("ext4", Mode::SingleNodeWriter),
        ))
        .await
        .expect_err("formatted over a view's unwritten data");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(!super::is_mounted(&staging), "staged anyway");
    assert!(
        !agent.log_text().contains(" formatted"),
        "{}",
        agent.log_text()
    );
    let head = std::fs::read(&img).expect("the volume file");
    assert_eq!(&head[..8], b"USERDATA", "the workload's bytes");
}
