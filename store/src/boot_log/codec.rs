//! The boot log's bytes: a header, then frames. A frame is its payload's length (u32), a checksum
//! of the payload (FNV-1a, u64) and the payload; all integers little-endian. A frame cut short
//! by a kill inside write(2), or not matching its checksum, ends what is read: the log is a
//! prefix of the writes. Nothing here is trusted beyond that: the file is the agent's own, in
//! its root-only state directory, and every length is checked against the bytes left.

use redb::TableHandle;

use crate::writer::{Op, StrTable};
use crate::{CLAIMS, FORMATS, LOOP_SNAPSHOTS, LOOP_VOLUMES, STAGED, StepRecord};

const MAGIC: &[u8; 8] = b"EBSBLOG1";
/// Magic, the boot id (36 ASCII bytes), the state file's nonce.
pub(super) const HEADER_LEN: usize = 8 + 36 + 8;
const FRAME_HEAD: usize = 4 + 8;

const WRITE: u8 = 1;
const VOID: u8 = 2;

/// What a frame says.
pub(super) enum Entry {
    /// A write's changes, under its ticket.
    Write(u64, Vec<Op>),
    /// Tickets whose batch failed: their callers were told so, and nothing replays them.
    Void(Vec<u64>),
}

pub(super) fn header(boot_id: &[u8; 36], nonce: u64) -> Vec<u8> {
    let mut h = Vec::with_capacity(HEADER_LEN);
    h.extend_from_slice(MAGIC);
    h.extend_from_slice(boot_id);
    h.extend_from_slice(&nonce.to_le_bytes());
    h
}

/// FNV-1a: enough to tell a frame cut short or torn, and to mix a nonce.
pub(super) fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn frame(payload: Vec<u8>) -> Option<Vec<u8>> {
    let len = u32::try_from(payload.len()).ok()?;
    let mut out = Vec::with_capacity(FRAME_HEAD + payload.len());
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&checksum(&payload).to_le_bytes());
    out.extend_from_slice(&payload);
    Some(out)
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) -> Option<()> {
    out.extend_from_slice(&u32::try_from(b.len()).ok()?.to_le_bytes());
    out.extend_from_slice(b);
    Some(())
}

/// A write's frame; `None` when a part is too long for its length field (never in practice:
/// the caller then stops the log rather than leave a hole in it).
pub(super) fn write_frame(ticket: u64, ops: &[Op]) -> Option<Vec<u8>> {
    let mut p = vec![WRITE];
    p.extend_from_slice(&ticket.to_le_bytes());
    p.extend_from_slice(&u32::try_from(ops.len()).ok()?.to_le_bytes());
    for op in ops {
        match op {
            Op::Put(def, key, value) => {
                p.push(1);
                put_bytes(&mut p, def.name().as_bytes())?;
                put_bytes(&mut p, key.as_bytes())?;
                put_bytes(&mut p, value)?;
            }
            Op::Delete(def, key) => {
                p.push(2);
                put_bytes(&mut p, def.name().as_bytes())?;
                put_bytes(&mut p, key.as_bytes())?;
            }
            Op::PutPublication {
                volume,
                target,
                value,
            } => {
                p.push(3);
                put_bytes(&mut p, volume.as_bytes())?;
                put_bytes(&mut p, target.as_bytes())?;
                put_bytes(&mut p, value)?;
            }
            Op::DeletePublication { volume, target } => {
                p.push(4);
                put_bytes(&mut p, volume.as_bytes())?;
                put_bytes(&mut p, target.as_bytes())?;
            }
            Op::ForgetVolume(volume) => {
                p.push(5);
                put_bytes(&mut p, volume.as_bytes())?;
            }
            Op::Step { volume, line } => {
                p.push(6);
                put_bytes(&mut p, volume.as_bytes())?;
                put_bytes(&mut p, &serde_json::to_vec(line).ok()?)?;
            }
        }
    }
    frame(p)
}

pub(super) fn void_frame(tickets: &[u64]) -> Option<Vec<u8>> {
    let mut p = vec![VOID];
    p.extend_from_slice(&u32::try_from(tickets.len()).ok()?.to_le_bytes());
    for t in tickets {
        p.extend_from_slice(&t.to_le_bytes());
    }
    frame(p)
}

/// A reader over bytes that fails (`None`) instead of reading past them.
struct Bytes<'a>(&'a [u8]);

impl<'a> Bytes<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.0.len() {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = usize::try_from(self.u32()?).ok()?;
        self.take(n)
    }
    fn string(&mut self) -> Option<String> {
        String::from_utf8(self.bytes()?.to_vec()).ok()
    }
}

/// The table a name stands for, among those a write may put to by key.
fn table(name: &[u8]) -> Option<StrTable> {
    [LOOP_VOLUMES, LOOP_SNAPSHOTS, FORMATS, CLAIMS, STAGED]
        .into_iter()
        .find(|t| t.name().as_bytes() == name)
}

fn op(b: &mut Bytes<'_>) -> Option<Op> {
    Some(match b.u8()? {
        1 => Op::Put(table(b.bytes()?)?, b.string()?, b.bytes()?.to_vec()),
        2 => Op::Delete(table(b.bytes()?)?, b.string()?),
        3 => Op::PutPublication {
            volume: b.string()?,
            target: b.string()?,
            value: b.bytes()?.to_vec(),
        },
        4 => Op::DeletePublication {
            volume: b.string()?,
            target: b.string()?,
        },
        5 => Op::ForgetVolume(b.string()?),
        6 => Op::Step {
            volume: b.string()?,
            line: serde_json::from_slice::<StepRecord>(b.bytes()?).ok()?,
        },
        _ => return None,
    })
}

fn entry(payload: &[u8]) -> Option<Entry> {
    let mut b = Bytes(payload);
    let entry = match b.u8()? {
        WRITE => {
            let ticket = b.u64()?;
            let n = b.u32()?;
            let mut ops = Vec::new();
            for _ in 0..n {
                ops.push(op(&mut b)?);
            }
            Entry::Write(ticket, ops)
        }
        VOID => {
            let n = b.u32()?;
            let mut tickets = Vec::new();
            for _ in 0..n {
                tickets.push(b.u64()?);
            }
            Entry::Void(tickets)
        }
        _ => return None,
    };
    b.0.is_empty().then_some(entry)
}

/// The entries of a log's bytes if its header is `header`: up to the first frame that is cut
/// short, fails its checksum or does not decode.
pub(super) fn entries(bytes: &[u8], header: &[u8]) -> Vec<Entry> {
    let Some(mut rest) = bytes.strip_prefix(header) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    while rest.len() >= FRAME_HEAD {
        let mut b = Bytes(rest);
        let (Some(len), Some(sum)) = (b.u32(), b.u64()) else {
            break;
        };
        let Some(payload) = usize::try_from(len).ok().and_then(|n| b.take(n)) else {
            break;
        };
        if checksum(payload) != sum {
            break;
        }
        let Some(e) = entry(payload) else { break };
        out.push(e);
        rest = b.0;
    }
    out
}
