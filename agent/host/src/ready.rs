//! Waiting for a descriptor to become readable (poll), for the waits that sleep on a socket:
//! the kernel's uevents while a device is awaited.

use std::io;
use std::os::fd::AsFd;
use std::time::Duration;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

/// Whether `fd` became readable within `timeout` (at most about 24 days; longer is cut).
pub fn readable_within(fd: impl AsFd, timeout: Duration) -> io::Result<bool> {
    let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    let timeout = PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX);
    let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
    Ok(poll(&mut fds, timeout)? > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::net::UnixStream;

    #[test]
    fn a_socket_is_readable_once_written_to() {
        let (mut a, b) = UnixStream::pair().expect("pair");
        assert!(!readable_within(&b, Duration::from_millis(1)).expect("poll"));
        a.write_all(b"x").expect("write");
        assert!(readable_within(&b, Duration::from_secs(5)).expect("poll"));
    }
}
