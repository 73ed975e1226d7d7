use super::*;
use crate::writer::Op;

struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Self {
        let p = std::env::temp_dir().join(format!("ebs-bootlog-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Dir(p)
    }
    fn state(&self) -> PathBuf {
        self.0.join("s.redb")
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn put(n: u64, size: usize) -> Vec<Op> {
    vec![Op::PutPublication {
        volume: "v".into(),
        target: format!("/t{n}"),
        value: vec![b'x'; size],
    }]
}

fn started(dir: &Dir, nonce: u64) -> BootLog {
    let (log, _) = BootLog::open(&dir.state(), Some(nonce)).unwrap().unwrap();
    log.begin(&dir.state(), nonce).unwrap()
}

fn log_of(dir: &Dir, nonce: u64) -> BootLog {
    BootLog::open(&dir.state(), Some(nonce)).unwrap().unwrap().0
}

/// The tickets a start finds for the file named `nonce`.
fn found(dir: &Dir, nonce: u64) -> Vec<u64> {
    let (_, held) = BootLog::open(&dir.state(), Some(nonce)).unwrap().unwrap();
    tickets(&held.writes)
}

fn tickets(held: &[Logged]) -> Vec<u64> {
    held.iter().map(|(t, _)| *t).collect()
}

#[test]
fn what_was_appended_comes_back_in_order_without_failed_batches() {
    let dir = Dir::new("order");
    let mut log = started(&dir, 7);
    for t in 1..=5 {
        assert!(log.append(t, &put(t, 10)));
    }
    log.void(&[2, 4]);
    drop(log);
    assert_eq!(found(&dir, 7), [1, 3, 5]);
    // What a reopen asks when its file lost nothing: no range at all (it panicked once).
    assert!(log_of(&dir, 7).read_since(5, 5).is_empty());
    assert!(log_of(&dir, 7).read_since(6, 5).is_empty());
    // Another state file's (or run's) nonce: nothing.
    assert!(found(&dir, 8).is_empty());
}

#[test]
fn a_frame_cut_short_ends_the_log_there() {
    let dir = Dir::new("torn");
    let mut log = started(&dir, 1);
    for t in 1..=3 {
        assert!(log.append(t, &put(t, 100)));
    }
    drop(log);
    let path = paths(&dir.state())[0].clone();
    let len = std::fs::metadata(&path).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(len - 5).unwrap();
    assert_eq!(found(&dir, 1), [1, 2]);
    // A flipped byte inside the second frame: the first alone.
    let mut bytes = std::fs::read(&path).unwrap();
    let at = bytes.len() - 150;
    bytes[at] ^= 0xff;
    std::fs::write(&path, bytes).unwrap();
    assert_eq!(found(&dir, 1), [1]);
}

#[test]
fn files_take_turns_and_are_emptied_once_durable() {
    let dir = Dir::new("turns");
    let mut log = started(&dir, 1);
    let big = 64 * 1024;
    let mut t = 0;
    while log.current == 0 {
        t += 1;
        assert!(log.append(t, &put(t, big)));
    }
    // The switch came with ticket t: the other file holds 1..t-1 until a durable commit does.
    assert_eq!(log.other_last, Some(t - 1));
    log.durable_through(t - 2);
    assert_eq!(log.other_last, Some(t - 1));
    assert_eq!(tickets(&log.read_since(0, u64::MAX)).len() as u64, t);
    log.durable_through(t - 1);
    assert_eq!(log.other_last, None);
    assert_eq!(tickets(&log.read_since(0, u64::MAX)), [t]);
    // No durable commit for long: the files switch once more, then the current one fills,
    // and a Boot write is made durable.
    while !log.wants_durable() {
        t += 1;
        assert!(log.append(t, &put(t, big)));
    }
    assert!(log.other_last.is_some());
    assert!(log.sizes[log.current] >= FULL_BYTES);
    log.durable_through(t);
    assert!(log.read_since(0, u64::MAX).is_empty());
    assert_eq!(log.sizes, [HEADER_LEN as u64; 2]);
}

#[test]
fn after_a_failed_append_nothing_is_logged_until_what_it_left_out_is_durable() {
    let dir = Dir::new("stop");
    let mut log = started(&dir, 1);
    assert!(log.append(1, &put(1, 10)));
    // Appends now fail (a descriptor that cannot write, as a full disk's would).
    let good = std::mem::replace(&mut log.files[0], File::open("/dev/null").unwrap());
    assert!(!log.append(2, &put(2, 10)));
    log.files[0] = good;
    assert!(log.wants_durable());
    assert!(!log.append(3, &put(3, 10)), "a hole would follow ticket 1");
    log.durable_through(2);
    assert!(!log.append(4, &put(4, 10)), "ticket 3 is not durable yet");
    log.durable_through(4);
    assert!(!log.wants_durable());
    assert!(log.append(5, &put(5, 10)));
    assert_eq!(tickets(&log.read_since(0, u64::MAX)), [5]);
}
