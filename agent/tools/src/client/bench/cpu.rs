//! CPU time spent during a measured window, from /proc/PID/stat: a process's own threads
//! (utime + stime, which includes the kernel work of its mount and umount calls) and its reaped
//! children (the mkfs and fsck tools it ran). On a machine with few cores a cycle at high
//! concurrency is CPU-bound, and then these figures, not latencies, explain the wall time.

use std::time::Duration;

/// CPU times of one process, in the kernel's clock ticks.
#[derive(Debug, Clone, Copy, Default)]
pub struct Ticks {
    own: u64,
    children: u64,
}

/// CPU spent in a window: by the process itself and by the children it reaped meanwhile.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CpuSpent {
    pub own: Duration,
    pub children: Duration,
}

impl CpuSpent {
    pub fn add(&mut self, o: CpuSpent) {
        self.own += o.own;
        self.children += o.children;
    }
}

pub fn read(pid: u32) -> Option<Ticks> {
    parse(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

pub fn read_self() -> Option<Ticks> {
    parse(&std::fs::read_to_string("/proc/self/stat").ok()?)
}

/// Fields 14–17 of stat(5): utime, stime, cutime, cstime; counted after the command name, which
/// is in parentheses and may itself contain spaces and parentheses.
fn parse(stat: &str) -> Option<Ticks> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<u64> = rest
        .split_whitespace()
        .skip(11)
        .take(4)
        .map(|v| v.parse().ok())
        .collect::<Option<_>>()?;
    let [utime, stime, cutime, cstime] = f.as_slice() else {
        return None;
    };
    Some(Ticks {
        own: utime + stime,
        children: cutime + cstime,
    })
}

/// The CPU spent between two readings of the same process.
pub fn spent(before: Ticks, after: Ticks) -> CpuSpent {
    let tick = clock_tick();
    CpuSpent {
        own: tick * after.own.saturating_sub(before.own) as u32,
        children: tick * after.children.saturating_sub(before.children) as u32,
    }
}

/// Adds `o`, when it was measured, to `total`.
pub fn add(total: &mut Option<CpuSpent>, o: Option<CpuSpent>) {
    if let Some(o) = o {
        total.get_or_insert_default().add(o);
    }
}

/// Adds the CPU spent between two readings to `total`, when both readings were possible.
pub fn add_spent(total: &mut Option<CpuSpent>, before: Option<Ticks>, after: Option<Ticks>) {
    if let (Some(before), Some(after)) = (before, after) {
        total.get_or_insert_default().add(spent(before, after));
    }
}

fn clock_tick() -> Duration {
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .filter(|hz| *hz > 0)
        .unwrap_or(100);
    Duration::from_secs(1) / hz as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_name_with_spaces_and_parentheses() {
        let line = "42 (tokio (rt) worker) S 1 42 42 0 -1 4194560 100 0 0 0 7 3 11 5 20 0 4 0";
        let t = parse(line).unwrap();
        assert_eq!((t.own, t.children), (10, 16));
        let s = spent(Ticks::default(), t);
        assert!(s.own > Duration::ZERO && s.children > s.own);
    }

    #[test]
    fn our_own_reading_works() {
        assert!(read_self().is_some());
    }
}
