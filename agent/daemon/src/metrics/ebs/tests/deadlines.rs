//! Deadlines, the scrape budget and the cap on parallel reads: a slow device costs its own
//! metrics and nothing else.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::*;

#[test]
fn a_slow_device_holds_neither_the_scrape_nor_the_other_volumes() {
    let mut env = Env::new("slow", |c| {
        c.limits.per_read = Duration::from_millis(200);
    });
    let slow = env.staged("vol-0510", Some(EBS_MODEL));
    env.staged("vol-0511", Some(EBS_MODEL));
    env.staged("vol-0512", Some(EBS_MODEL));
    env.stub.answer(&slow, || {
        std::thread::sleep(Duration::from_millis(1500));
        Ok(encode(&stats(9)))
    });
    let t = Instant::now();
    let (s, _) = env.scrape();
    assert!(
        t.elapsed() < Duration::from_millis(1000),
        "waited {:?}",
        t.elapsed()
    );
    assert_eq!(s.volumes.len(), 2);
    assert_eq!(reasons(&s), HashMap::from([("timeout", 1)]));
    // The stuck read still holds its device: the next scrape does not start a second one.
    assert_eq!(env.source.reads_in_flight(), 1);
    let (s, _) = env.scrape();
    assert_eq!(s.volumes.len(), 2);
    assert_eq!(reasons(&s), HashMap::from([("timeout", 1), ("busy", 1)]));
    assert_eq!(env.stub.calls.load(Ordering::SeqCst), 5);
}

#[test]
fn a_stuck_read_gives_its_turn_to_the_next_volume() {
    let mut env = Env::new("turn", |c| {
        c.limits.parallel = 1;
        c.limits.per_read = Duration::from_millis(100);
    });
    let stuck = env.staged("vol-0a", Some(EBS_MODEL));
    env.staged("vol-0b", Some(EBS_MODEL));
    env.staged("vol-0c", Some(EBS_MODEL));
    env.stub.answer(&stuck, || {
        std::thread::sleep(Duration::from_millis(1500));
        Ok(encode(&stats(1)))
    });
    let t = Instant::now();
    let (s, _) = env.scrape();
    assert!(
        t.elapsed() < Duration::from_millis(1000),
        "waited {:?}",
        t.elapsed()
    );
    let read: Vec<&str> = s.volumes.iter().map(|(v, _)| v.as_str()).collect();
    assert_eq!(read, vec!["vol-0b", "vol-0c"]);
    assert_eq!(reasons(&s), HashMap::from([("timeout", 1)]));
}

#[test]
fn reads_run_in_parallel_up_to_the_cap() {
    let mut env = Env::new("parallel", |c| c.limits.parallel = 3);
    for i in 0..12 {
        let disk = env.staged(&format!("vol-0{i:x}"), Some(EBS_MODEL));
        env.stub.answer(&disk, || {
            std::thread::sleep(Duration::from_millis(30));
            Ok(encode(&stats(1)))
        });
    }
    let (s, _) = env.scrape();
    assert_eq!(s.volumes.len(), 12);
    let most = env.stub.most.load(Ordering::SeqCst);
    assert!((2..=3).contains(&most), "{most} reads at once");
}

#[test]
fn the_budget_bounds_the_whole_scrape() {
    let mut env = Env::new("budget", |c| {
        c.limits.parallel = 1;
        c.limits.per_read = Duration::from_millis(150);
        c.limits.budget = Duration::from_millis(400);
    });
    for i in 0..6 {
        let disk = env.staged(&format!("vol-0{i:x}"), Some(EBS_MODEL));
        env.stub.answer(&disk, || {
            std::thread::sleep(Duration::from_millis(1000));
            Ok(encode(&stats(1)))
        });
    }
    let t = Instant::now();
    let (s, _) = env.scrape();
    assert!(
        t.elapsed() < Duration::from_millis(900),
        "waited {:?}",
        t.elapsed()
    );
    assert_eq!(reasons(&s), HashMap::from([("timeout", 6)]));
    assert!(env.stub.calls.load(Ordering::SeqCst) <= 3);
}
