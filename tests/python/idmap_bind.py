"""An idmapped bind of SOURCE at TARGET, `nodev`, mapping the filesystem's root to the user
nobody (65534) and back: open_tree(OPEN_TREE_CLONE), mount_setattr(MOUNT_ATTR_IDMAP) with the
user namespace of a helper process, move_mount. The agent never makes such a mount; the guards
tests lay one where it would make its own (util-linux before 2.39 has no X-mount.idmap).

Usage: python3 idmap_bind.py SOURCE TARGET
"""

import ctypes
import os
import struct
import subprocess
import sys
import time

AT_FDCWD = -100
AT_EMPTY_PATH = 0x1000
OPEN_TREE_CLONE = 1
OPEN_TREE_CLOEXEC = 0o2000000
MOUNT_ATTR_NODEV = 0x4
MOUNT_ATTR_IDMAP = 0x100000
MOVE_MOUNT_F_EMPTY_PATH = 4
SYS_OPEN_TREE, SYS_MOVE_MOUNT, SYS_MOUNT_SETATTR = 428, 429, 442

libc = ctypes.CDLL(None, use_errno=True)


def check(rc, what):
    if rc < 0:
        sys.exit(f"{what}: {os.strerror(ctypes.get_errno())}")
    return rc


def main(source, target):
    helper = subprocess.Popen(["unshare", "--user", "sleep", "60"])
    try:
        for _ in range(100):
            if os.readlink(f"/proc/{helper.pid}/ns/user") != os.readlink("/proc/self/ns/user"):
                break
            time.sleep(0.02)
        for m in ("uid_map", "gid_map"):
            with open(f"/proc/{helper.pid}/{m}", "w") as f:
                f.write("0 65534 1\n")
        userns = os.open(f"/proc/{helper.pid}/ns/user", os.O_RDONLY)
        tree = check(
            libc.syscall(SYS_OPEN_TREE, AT_FDCWD, source.encode(), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC),
            "open_tree",
        )
        attr = ctypes.create_string_buffer(struct.pack("QQQQ", MOUNT_ATTR_IDMAP | MOUNT_ATTR_NODEV, 0, 0, userns))
        check(libc.syscall(SYS_MOUNT_SETATTR, tree, b"", AT_EMPTY_PATH, attr, 32), "mount_setattr")
        check(
            libc.syscall(SYS_MOVE_MOUNT, tree, b"", AT_FDCWD, target.encode(), MOVE_MOUNT_F_EMPTY_PATH),
            "move_mount",
        )
    finally:
        helper.kill()
        helper.wait()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
