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

/// A FUSE server of one 16 MiB file, `img`, that answers everything a loop device needs, and
/// FSYNC too until the file named by its second argument exists (then never, as a stopped
/// daemon or an unreachable NFS server would not).
const SERVER: &str = r#"
import os, sys, struct, ctypes, errno
mnt = sys.argv[1]; hang = sys.argv[2]; SIZE = 16 << 20; data = bytearray(SIZE)
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
        reply(unique, 0, bytes(data[off:off + size]))
    elif op == 16:
        fh, off, size = struct.unpack_from('<QQI', arg)
        data[off:off + size] = arg[40:40 + size]
        reply(unique, 0, struct.pack('<II', size, 0))
    elif op == 20:
        if not os.path.exists(hang):
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

#[tokio::test]
async fn an_operators_loop_device_over_an_unanswering_fuse_file_holds_up_no_stage() {
    let _shared = crate::NAMESPACE_COPY.read().await;
    if !require_root("an_operators_loop_device_over_an_unanswering_fuse_file_holds_up_no_stage") {
        return;
    }
    let scratch = Scratch::new("node-local-fuse-view");
    let mnt = scratch.join("fuse");
    let hang = scratch.join("hang");
    std::fs::create_dir_all(&mnt).expect("the FUSE mount point");
    // Dropped in reverse: the server first (its connection aborts, its waiters fail, the
    // agent's too if it waits on it), then the loop device, the agent, the mount.
    let _mount = Lazily(mnt.clone());
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let mut server = std::process::Command::new("python3")
        .args([
            "-c",
            SERVER,
            &mnt.display().to_string(),
            &hang.display().to_string(),
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("the FUSE server");
    let out = server.stdout.take().expect("its stdout");
    let mut line = String::new();
    let _ = std::io::BufRead::read_line(&mut std::io::BufReader::new(out), &mut line);
    let server = Reaped(server);
    assert_eq!(line.trim(), "mounted", "the FUSE server did not mount");
    let _operators = DetachOnDrop(super::losetup("", mnt.join("img").display()));
    let _server = server;
    std::fs::write(&hang, b"").expect("from now on FSYNC is never answered");

    let v = create_attached(&agent, "beside-fuse", SIZE).await;
    let staging = agent.work.join("beside-fuse/staging");
    let mut node = agent.node().await;
    let cap = mount_cap("ext4", Mode::SingleNodeWriter);
    let stage = node.node_stage_volume(stage_req(&v, &staging, cap));
    let answered = tokio::time::timeout(std::time::Duration::from_secs(15), stage).await;
    let answer = answered.expect("the stage hung on the FUSE server's flush");
    answer.expect("the stage beside an operator's loop device over FUSE");
    assert!(super::is_mounted(&staging), "not staged");
    agent
        .node()
        .await
        .node_unstage_volume(unstage_req(&v, &staging))
        .await
        .expect("unstage");
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
    // Buffered writes at 0 and 8 MiB, the device kept open so its last close does not flush.
    let ready = scratch.join("written");
    let writer = std::process::Command::new("python3")
        .args([
            "-c",
            "import os,sys,time\n\
             fd=os.open(sys.argv[1],os.O_WRONLY)\n\
             for off in (0, 8<<20): os.pwrite(fd, b'USERDATA'*512, off)\n\
             open(sys.argv[2],'w').close()\n\
             time.sleep(600)",
            &second.0,
            &ready.display().to_string(),
        ])
        .spawn()
        .expect("the writer");
    let _writer = Reaped(writer);
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !ready.exists() && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(ready.exists(), "the writer did not write");
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
