//! Hostile local clients on the CSI socket. Anyone who can reach the socket (on Kubernetes, every
//! sidecar that shares `/csi`) may send anything; none of it may take the agent down or lock the
//! orchestrator out.
//! - `hpack`: header blocks that decode to far more than they weigh (an HPACK bomb);
//! - `idle`: connections that hold a slot and send nothing, or only part of the preface.

mod hpack;
mod idle;
mod unread;

use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
pub const HEADERS: u8 = 0x1;
pub const SETTINGS: u8 = 0x4;
pub const GOAWAY: u8 = 0x7;
pub const CONTINUATION: u8 = 0x9;
pub const END_HEADERS: u8 = 0x4;

pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    f.extend_from_slice(&[kind, flags]);
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// The client preface and an empty SETTINGS frame: a connection h2 has accepted.
pub fn handshake() -> Vec<u8> {
    [PREFACE, &frame(SETTINGS, 0, 0, &[])].concat()
}

/// What the server did with a connection, read until it closed it (or `within` passed).
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// GOAWAY with this error code, then the connection closed.
    GoAway(u32),
    /// Closed (or reset) without a GOAWAY.
    Closed,
    /// Still open after the time allowed.
    StillOpen,
}

pub fn outcome(s: &mut UnixStream, within: Duration) -> Outcome {
    let _ = s.set_read_timeout(Some(within));
    let mut goaway = None;
    loop {
        let mut head = [0u8; 9];
        match s.read_exact(&mut head) {
            Ok(()) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Outcome::StillOpen;
            }
            Err(_) => return goaway.map_or(Outcome::Closed, Outcome::GoAway),
        }
        let len = (head[0] as usize) << 16 | (head[1] as usize) << 8 | head[2] as usize;
        let mut payload = vec![0u8; len];
        if s.read_exact(&mut payload).is_err() {
            return goaway.map_or(Outcome::Closed, Outcome::GoAway);
        }
        if head[3] == GOAWAY && payload.len() >= 8 {
            goaway = Some(u32::from_be_bytes([
                payload[4], payload[5], payload[6], payload[7],
            ]));
        }
    }
}

/// Connects and writes `bytes`; a server that closes while we write is an answer too.
pub fn send(socket: &Path, bytes: &[u8]) -> UnixStream {
    let mut s = UnixStream::connect(socket).expect("connect");
    let _ = s.write_all(bytes);
    s
}

/// Whether the server still holds `s` open (what it sent meanwhile is read and dropped).
pub fn is_open(s: &mut UnixStream) -> bool {
    let _ = s.set_nonblocking(true);
    let mut buf = [0u8; 4096];
    let open = loop {
        match s.read(&mut buf) {
            Ok(0) => break false,
            Ok(_) => continue,
            Err(e) if e.kind() == ErrorKind::WouldBlock => break true,
            Err(_) => break false,
        }
    };
    let _ = s.set_nonblocking(false);
    open
}
