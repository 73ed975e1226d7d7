//! The agent's memory, read from /proc/PID/status: VmRSS now, VmHWM (the kernel's own high-water
//! mark) since the process started, and RssAnon, the part that is the agent's own. The rest of
//! VmRSS is file pages mapped from the binary and its libraries, clean and shared with the page
//! cache, and its size is the kernel's choice more than the agent's: on 6.18 a fault maps the
//! whole large folio readahead made (runs of 64 KiB to 1 MiB), so an idle agent showed 8.5 MiB
//! of its 10 MiB of code resident, against about 4 MiB before.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Memory {
    pub rss_kib: u64,
    pub hwm_kib: u64,
    /// RssAnon: the heap, stacks and written data (0 where the kernel does not say, before 4.5).
    pub anon_kib: u64,
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
        anon_kib: field("RssAnon:").unwrap_or(0),
    })
}

/// Samples VmRSS every few milliseconds on its own thread until stopped; the maximum seen is the
/// peak during the measured window (VmHWM also counts anything before the bench started).
pub struct Sampler {
    stop: Arc<AtomicBool>,
    peak: Arc<AtomicU64>,
    peak_anon: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Sampler {
    pub fn start(pid: u32) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let peak = Arc::new(AtomicU64::new(0));
        let peak_anon = Arc::new(AtomicU64::new(0));
        let thread = {
            let (stop, peak, anon) = (Arc::clone(&stop), Arc::clone(&peak), Arc::clone(&peak_anon));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if let Some(m) = read(pid) {
                        peak.fetch_max(m.rss_kib, Ordering::Relaxed);
                        anon.fetch_max(m.anon_kib, Ordering::Relaxed);
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
            })
        };
        Sampler {
            stop,
            peak,
            peak_anon,
            thread: Some(thread),
        }
    }

    /// Stops sampling; returns the largest VmRSS and RssAnon seen, in KiB.
    pub fn finish(mut self) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        (
            self.peak.load(Ordering::Relaxed),
            self.peak_anon.load(Ordering::Relaxed),
        )
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
        let text = "Name:\tx\nVmHWM:\t   10240 kB\nVmRSS:\t    8192 kB\nRssAnon:\t 1024 kB\n";
        assert_eq!(
            parse(text),
            Some(Memory {
                rss_kib: 8192,
                hwm_kib: 10240,
                anon_kib: 1024,
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
