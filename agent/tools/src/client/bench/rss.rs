//! The agent's memory, read from /proc/PID/status: VmRSS now, VmHWM (the kernel's own high-water
//! mark) since the process started.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Memory {
    pub rss_kib: u64,
    pub hwm_kib: u64,
}

pub fn read(pid: u32) -> Option<Memory> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse(&text)
}

fn parse(status: &str) -> Option<Memory> {
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
    };
    Some(Memory {
        rss_kib: field("VmRSS:")?,
        hwm_kib: field("VmHWM:")?,
    })
}

/// Samples VmRSS every few milliseconds on its own thread until stopped; the maximum seen is the
/// peak during the measured window (VmHWM also counts anything before the bench started).
pub struct Sampler {
    stop: Arc<AtomicBool>,
    peak: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Sampler {
    pub fn start(pid: u32) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let peak = Arc::new(AtomicU64::new(0));
        let thread = {
            let (stop, peak) = (Arc::clone(&stop), Arc::clone(&peak));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if let Some(m) = read(pid) {
                        peak.fetch_max(m.rss_kib, Ordering::Relaxed);
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
            })
        };
        Sampler {
            stop,
            peak,
            thread: Some(thread),
        }
    }

    /// Stops sampling; returns the largest VmRSS seen, in KiB.
    pub fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.peak.load(Ordering::Relaxed)
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_status() {
        let text = "Name:\tx\nVmHWM:\t   10240 kB\nVmRSS:\t    8192 kB\n";
        assert_eq!(
            parse(text),
            Some(Memory {
                rss_kib: 8192,
                hwm_kib: 10240
            })
        );
        assert_eq!(parse("Name: x\n"), None);
    }

    #[test]
    fn reads_own_process() {
        let me = read(std::process::id()).expect("own status");
        assert!(me.rss_kib > 0 && me.hwm_kib >= me.rss_kib);
    }
}
