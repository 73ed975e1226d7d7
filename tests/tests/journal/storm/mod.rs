//! Random SIGKILLs during a storm: many volumes move through stage, publish, write, unpublish and
//! unstage at once while the agent is killed at random moments and restarted on the same state.
//! The crash matrix kills one volume at each named step; here the kills land wherever the
//! concurrent calls happen to be (mkfs, fsck, a mount, a journal commit of another volume). Then
//! every volume converges, and nothing may be formatted twice, lost, stacked or left behind.
//!
//! The kill times come from a seeded PRNG; the seed is printed, `EBS_STORM_SEED=<n>` replays them
//! (the calls' interleaving is the scheduler's, so a replay is likely, not certain, to repeat).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tonic::Status;

use super::*;

mod support;
use support::{Rng, fsck, mkfs_line, seed, status_of, write_record};

/// Volumes in the storm: small ext4 ones, and xfs at its minimum size.
const EXT4_VOLUMES: usize = 8;
const XFS_VOLUMES: usize = 2;
/// No call answers after this: a hung agent is a failure, not a wait.
const CALL_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a volume may take to reach its final state once the storm is over.
const SETTLE: Duration = Duration::from_secs(20);

/// What the storm saw: failed calls by call and code (expected while the agent dies), and broken
/// invariants (never expected).
#[derive(Default)]
struct Seen {
    errors: BTreeMap<String, (usize, String)>,
    broken: Vec<String>,
}

type Shared = Arc<Mutex<Seen>>;

fn note_error(seen: &Shared, op: Op, e: &Status) {
    let mut s = seen.lock().unwrap();
    let entry = s
        .errors
        .entry(format!("{op:?} {:?}", e.code()))
        .or_insert((0, e.message().to_string()));
    entry.0 += 1;
}

fn broke(seen: &Shared, what: String) {
    eprintln!("BROKEN: {what}");
    seen.lock().unwrap().broken.push(what);
}

/// One volume of the storm and what the test knows about it.
struct Volume {
    c: Cycle,
    fs: &'static str,
    /// The filesystem UUID after the first stage that answered OK.
    uuid: Option<String>,
    /// The log's length then: no "formatted" line for this volume may come after it.
    log_mark: u64,
    /// Whether the test wiped it after a kill inside its first mkfs (`settle`).
    wiped: bool,
    /// Every record written through the target, with its bytes.
    written: BTreeMap<String, Vec<u8>>,
    cycles: usize,
}

/// One CSI call over the socket, with a connection of its own: unlike `call`, a dead agent is
/// an error (UNAVAILABLE), not a panic, and a call that never answers times out.
async fn call_at(socket: &Path, c: &Cycle, op: Op) -> Result<(), Status> {
    let attempt = async {
        let ch = channel(socket)
            .await
            .map_err(|e| Status::unavailable(format!("connect: {e}")))?;
        call_on(&mut csi::node_client::NodeClient::new(ch), c, op).await
    };
    tokio::time::timeout(CALL_TIMEOUT, attempt)
        .await
        .unwrap_or_else(|_| Err(Status::deadline_exceeded("no answer in 20 s")))
}

/// What must hold right after `op` answered OK, with no other call on this volume in flight:
/// kills and restarts in between may not move its mounts or change its filesystem.
fn after_ok(v: &mut Volume, op: Op, rng: &mut Rng, log: &Path, seen: &Shared) {
    let id = v.c.vol.id.clone();
    let (s, t) = (mount_count(&v.c.staging), mount_count(&v.c.target));
    match op {
        Op::Stage | Op::Publish if s != 1 => {
            broke(seen, format!("{id} after {op:?}: {s} staging mounts"))
        }
        Op::Publish if t != 1 => broke(seen, format!("{id} after publish: {t} target mounts")),
        Op::Unpublish if t != 0 => broke(seen, format!("{id} after unpublish: {t} target mounts")),
        Op::Unstage if s != 0 => broke(seen, format!("{id} after unstage: {s} staging mounts")),
        _ => {}
    }
    if op == Op::Stage
        && let Err(e) = same_fs(v, log)
    {
        broke(seen, e);
    }
    if op == Op::Publish && t == 1 {
        // A record per cycle, unique to this volume and cycle, from the seeded stream.
        let name = format!("rec-{:04}", v.cycles);
        let mut bytes = format!("{id} cycle {}\n", v.cycles).into_bytes();
        bytes.extend((0..512).flat_map(|_| rng.next().to_le_bytes()));
        match write_record(&v.c.target, &name, &bytes) {
            Ok(()) => drop(v.written.insert(name, bytes)),
            Err(e) => broke(
                seen,
                format!("{id}: writing {name} through the target: {e}"),
            ),
        }
    }
}

/// The filesystem once a stage answered OK: the first time it is noted, with the log's length
/// then; every later time it must be the same one.
fn same_fs(v: &mut Volume, log: &Path) -> Result<(), String> {
    let now = fs_uuid(&v.c.vol.device);
    match &v.uuid {
        None => {
            v.uuid = Some(now);
            v.log_mark = std::fs::metadata(log).map_or(0, |m| m.len());
            Ok(())
        }
        Some(first) if *first != now => Err(format!(
            "{}: UUID {first} became {now}: formatted again",
            v.c.vol.id
        )),
        Some(_) => Ok(()),
    }
}

/// One volume's part of the storm: the lifecycle over and over, each call retried as a CO
/// would after a failure, until `stop`.
async fn storm(
    socket: PathBuf,
    log: PathBuf,
    mut v: Volume,
    mut rng: Rng,
    stop: Arc<AtomicBool>,
    seen: Shared,
) -> Volume {
    'cycles: loop {
        for op in [Op::Stage, Op::Publish, Op::Unpublish, Op::Unstage] {
            loop {
                if stop.load(Ordering::SeqCst) {
                    break 'cycles;
                }
                match call_at(&socket, &v.c, op).await {
                    Ok(()) => break,
                    Err(e) => {
                        note_error(&seen, op, &e);
                        tokio::time::sleep(rng.millis(10, 50)).await;
                    }
                }
            }
            after_ok(&mut v, op, &mut rng, &log, &seen);
            tokio::time::sleep(rng.millis(0, 20)).await;
        }
        v.cycles += 1;
    }
    v
}

/// `op` retried until it answers OK: transient refusals (the agent starting, a call in flight)
/// until the deadline, any other code only a few times (a tool orphaned by a kill may still hold
/// the device for a moment), as the crash matrix allows.
///
/// One refusal is the agent's documented price of a kill inside mkfs (docs/design.md, "A retried
/// call resumes"): mkfs's partial metadata without its superblock cannot be told from data, so the
/// stage is refused for the operator to wipe the device. The test is that operator, and only for a
/// volume no stage had answered OK for (nothing of ours can be on it), once.
async fn settle(agent: &Agent, v: &mut Volume, op: Op, seed: u64) {
    let deadline = Instant::now() + SETTLE;
    let mut same = 0;
    let mut last = None;
    let interrupted = format!("an earlier mkfs of volume {} ", v.c.vol.id);
    loop {
        let Err(e) = call_at(&agent.socket, &v.c, op).await else {
            return;
        };
        if op == Op::Stage
            && e.code() == Code::FailedPrecondition
            && e.message().contains(&interrupted)
            && v.uuid.is_none()
            && !v.wiped
        {
            eprintln!(
                "storm seed {seed}: {}: mkfs cut short, wiped: {}",
                v.c.vol.id,
                e.message()
            );
            sh(&format!("blkdiscard -f {}", v.c.vol.device));
            v.wiped = true;
            continue;
        }
        let transient = matches!(e.code(), Code::Unavailable | Code::Aborted);
        same = if last == Some(e.code()) { same + 1 } else { 1 };
        last = Some(e.code());
        if Instant::now() > deadline || (!transient && same >= 30) {
            let id = &v.c.vol.id;
            panic!(
                "seed {seed}: {id} never settled {op:?}: {e:?}\n{}",
                log_tail(agent, id)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The end of the agent's log, the lines naming `about` ("" for all): a storm's whole log is
/// thousands of lines.
fn log_tail(agent: &Agent, about: &str) -> String {
    let text = agent.log_text();
    let lines: Vec<&str> = text.lines().filter(|l| l.contains(about)).collect();
    let from = lines.len().saturating_sub(400);
    let shown = lines[from..].join("\n");
    format!(
        "agent log, last {} lines with {about:?}:\n{shown}",
        lines.len() - from
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn random_kills_during_a_storm_corrupt_nothing() {
    if !require_root("random_kills_during_a_storm_corrupt_nothing") {
        return;
    }
    let started = Instant::now();
    let seed = seed();
    eprintln!("storm seed {seed} (EBS_STORM_SEED={seed} replays the kill times)");
    let scratch = Scratch::new("storm");
    let mut agent = Agent::start(&scratch, AgentOpts::default()).await;
    let mut volumes = Vec::new();
    for i in 0..EXT4_VOLUMES + XFS_VOLUMES {
        let (fs, size) = if i < EXT4_VOLUMES {
            ("ext4", 64 << 20)
        } else {
            ("xfs", 320 << 20)
        };
        let name = format!("storm{i}");
        let vol = create_attached(&agent, &name, size).await;
        let c = Cycle::new(&agent, vol, &name, fs);
        let (uuid, log_mark, wiped, written, cycles) = (None, 0, false, BTreeMap::new(), 0);
        volumes.push(Volume {
            c,
            fs,
            uuid,
            log_mark,
            wiped,
            written,
            cycles,
        });
    }

    // The storm, and the kills: each after a random pause, the next start on the same state.
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Shared::default();
    let tasks: Vec<_> = volumes
        .into_iter()
        .enumerate()
        .map(|(i, v)| {
            let rng = Rng::new(seed, i as u64 + 1);
            let (socket, log) = (agent.socket.clone(), agent.log.clone());
            tokio::spawn(storm(socket, log, v, rng, stop.clone(), seen.clone()))
        })
        .collect();
    let mut rng = Rng::new(seed, 0);
    let kills = rng.between(3, 5);
    agent.opts.wait_ready = false;
    for k in 1..=kills {
        tokio::time::sleep(rng.millis(50, 600)).await;
        agent.kill();
        eprintln!(
            "storm seed {seed}: kill {k}/{kills} at {:?}",
            started.elapsed()
        );
        agent.spawn().await;
        if let Err(why) = agent.try_wait_ready(Duration::from_secs(20)).await {
            panic!("seed {seed}: no restart after kill {k}: {why}");
        }
    }
    tokio::time::sleep(rng.millis(50, 600)).await;
    stop.store(true, Ordering::SeqCst);
    let mut volumes = Vec::new();
    for t in tasks {
        let v = tokio::time::timeout(CALL_TIMEOUT * 2, t).await;
        volumes.push(v.expect("a storm task ends").expect("a storm task"));
    }
    let storm_took = started.elapsed();

    // Converge: every volume staged and published, whatever the storm left.
    for v in &mut volumes {
        settle(&agent, v, Op::Stage, seed).await;
        // The first stage of a volume the storm never saw staged, or the same filesystem.
        if let Err(e) = same_fs(v, &agent.log) {
            broke(&seen, e);
        }
        settle(&agent, v, Op::Publish, seed).await;
    }
    let mut broken = std::mem::take(&mut seen.lock().unwrap().broken);
    let mounts = mounts_below(&agent.work);
    let unique: BTreeSet<_> = mounts.iter().collect();
    if unique.len() != mounts.len() || mounts.len() != 2 * volumes.len() {
        broken.push(format!(
            "published everywhere, yet the mounts are {mounts:#?}"
        ));
    }
    let status = agent.status_json();
    let log = std::fs::read(&agent.log).unwrap_or_default();
    for v in &mut volumes {
        if let Err(e) = same_fs(v, &agent.log) {
            broken.push(e);
        }
        let id = &v.c.vol.id;
        let mounts = (mount_count(&v.c.staging), mount_count(&v.c.target));
        if mounts != (1, 1) {
            broken.push(format!(
                "{id}: (staging, target) mounts {mounts:?}, not (1, 1)"
            ));
        }
        // Its mkfs is in the log before the first stage's answer, and none after it (a retried
        // mkfs before that, over its own half-made filesystem, is the journal's design).
        let (before, after) = log.split_at((v.log_mark as usize).min(log.len()));
        if mkfs_line(before, id).is_none() {
            broken.push(format!(
                "{id}: no mkfs logged before its first stage answered"
            ));
        }
        if let Some(line) = mkfs_line(after, id) {
            broken.push(format!("{id}: formatted after its first stage: {line}"));
        }
        // Every record is there with its bytes, and nothing else: none went past the volume.
        let on_disk: BTreeMap<String, Vec<u8>> = std::fs::read_dir(&v.c.target)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("rec-"))
            .map(|n| {
                (
                    n.clone(),
                    std::fs::read(v.c.target.join(n)).unwrap_or_default(),
                )
            })
            .collect();
        let keys = v.written.keys().chain(on_disk.keys());
        let differ: BTreeSet<_> = keys
            .filter(|n| on_disk.get(*n) != v.written.get(*n))
            .collect();
        if !differ.is_empty() {
            broken.push(format!(
                "{id}: records lost, changed or unknown: {differ:?}"
            ));
        }
        let (staged, published, st) = status_of(&status, id);
        if !staged || published != 1 {
            broken.push(format!(
                "{id}: staged and published once, yet status says {st}"
            ));
        }
    }

    // Down again, then nothing may be left: no mount, no record in the state, no damage.
    for v in &mut volumes {
        settle(&agent, v, Op::Unpublish, seed).await;
        settle(&agent, v, Op::Unstage, seed).await;
    }
    let left = mounts_below(&agent.work);
    if !left.is_empty() {
        broken.push(format!("left mounted: {left:?}"));
    }
    let status = agent.status_json();
    for v in &volumes {
        let id = &v.c.vol.id;
        let (staged, published, st) = status_of(&status, id);
        if staged || published != 0 || !st["needs_attention"].is_null() {
            broken.push(format!("{id}: after unstage, status says {st}"));
        }
        if let Err(e) = fsck(v.fs, &v.c.vol.device) {
            broken.push(format!("{id}: {e}"));
        }
    }

    let seen = seen.lock().unwrap();
    let cycles: usize = volumes.iter().map(|v| v.cycles).sum();
    let records: usize = volumes.iter().map(|v| v.written.len()).sum();
    let wiped = volumes.iter().filter(|v| v.wiped).count();
    eprintln!(
        "storm seed {seed}: {} volumes, {kills} kills, {cycles} full cycles, {records} records, \
         {wiped} wiped after a kill inside mkfs, storm {storm_took:?}, total {:?}; failed calls \
         during the storm:",
        volumes.len(),
        started.elapsed()
    );
    for (what, (n, first)) in &seen.errors {
        eprintln!("  {n:4} × {what} (first: {first})");
    }
    assert!(
        broken.is_empty(),
        "seed {seed}: invariants broken:\n  {}\n{}",
        broken.join("\n  "),
        log_tail(&agent, "")
    );
}
