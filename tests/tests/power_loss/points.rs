//! Which entries of a log are power-cut points, which calls had been acknowledged at each, and
//! which of them a bounded run replays.

use ebs_tests::log_writes::Log;

/// The guest's marks, in the order of its workload: each follows an acknowledged call.
pub const CALLS: [&str; 7] = [
    "agent-ready",
    "staged",
    "published",
    "written",
    "unpublished",
    "unstaged",
    "restaged",
];

/// A place in the log where the power may go: right after a FLUSH or FUA entry (everything
/// before it durable), or at a mark (right after a call was acknowledged).
#[derive(Clone, Debug)]
pub struct Point {
    pub index: usize,
    pub what: String,
}

pub struct Timeline {
    marks: Vec<(usize, String)>,
}

impl Timeline {
    pub fn of(log: &Log) -> Timeline {
        Timeline { marks: log.marks() }
    }

    /// Whether the call behind `mark` was acknowledged before the power went at `point`.
    pub fn acked(&self, point: usize, mark: &str) -> bool {
        self.marks.iter().any(|(i, m)| m == mark && *i <= point)
    }

    /// The last acknowledged call at `point`, or "" before the first.
    pub fn last_call(&self, point: usize) -> &str {
        CALLS
            .iter()
            .rev()
            .find(|c| self.acked(point, c))
            .copied()
            .unwrap_or("")
    }
}

/// Every point from the moment the state filesystem existed (mark `state-fs`) to the end of the
/// workload (mark `end`). A durability point that follows another with no write in between
/// rebuilds the same disk with the same calls acknowledged: it is folded into the first.
pub fn all(log: &Log) -> Result<Vec<Point>, String> {
    let start = log.mark("state-fs").ok_or("no state-fs mark in the log")?;
    let end = log.mark("end").ok_or("no end mark in the log")?;
    for call in CALLS {
        log.mark(call).ok_or(format!("no {call} mark in the log"))?;
    }
    let mut out: Vec<Point> = Vec::new();
    let mut changed = true;
    for (i, e) in log.entries.iter().enumerate().take(end + 1).skip(start + 1) {
        if e.changes_device() {
            changed = true;
        }
        let what = if let Some(m) = &e.mark {
            format!("mark {m}")
        } else if e.is_durability_point() {
            if !changed {
                continue;
            }
            match (e.is_flush(), e.is_fua()) {
                (true, true) => "flush+fua".into(),
                (true, false) => "flush".into(),
                _ => "fua".into(),
            }
        } else {
            continue;
        };
        changed = false;
        out.push(Point { index: i, what });
    }
    Ok(out)
}

/// Every write (or discard) that is not itself a durability point, from `state-fs` to `end`:
/// a power cut right after it keeps it and every write completed before it, flushed or not (a
/// device without a volatile cache, or one that happened to persist in order). These show that
/// no decision rests on data that was written but not yet flushed.
pub fn prefixes(log: &Log) -> Vec<Point> {
    let (Some(start), Some(end)) = (log.mark("state-fs"), log.mark("end")) else {
        return Vec::new();
    };
    log.entries
        .iter()
        .enumerate()
        .take(end)
        .skip(start + 1)
        .filter(|(_, e)| e.changes_device() && !e.is_durability_point())
        .map(|(index, e)| Point {
            index,
            what: if e.is_discard() { "discard" } else { "write" }.into(),
        })
        .collect()
}

/// `n` of `points`, evenly spaced (all of them if there are no more).
pub fn spread(points: &[Point], n: Option<usize>) -> Vec<Point> {
    let Some(n) = n.filter(|n| *n < points.len()) else {
        return points.to_vec();
    };
    let step = points.len() as f64 / n as f64;
    (0..n)
        .map(|k| points[(k as f64 * step) as usize].clone())
        .collect()
}

/// At most `budget` points: every mark and every point of the first stage (the one that runs
/// mkfs), then the others evenly spaced. `None`: all.
pub fn sample(points: &[Point], log: &Log, budget: Option<usize>) -> Vec<Point> {
    let Some(budget) = budget.filter(|b| *b < points.len()) else {
        return points.to_vec();
    };
    let (ready, staged) = (
        log.mark("agent-ready").unwrap_or(0),
        log.mark("staged").unwrap_or(0),
    );
    let must = |p: &Point| p.what.starts_with("mark") || (ready..=staged).contains(&p.index);
    let (mut chosen, rest): (Vec<Point>, Vec<Point>) = points.iter().cloned().partition(must);
    let room = budget.saturating_sub(chosen.len());
    chosen.extend(spread(&rest, Some(room)));
    chosen.sort_by_key(|p| p.index);
    chosen
}
