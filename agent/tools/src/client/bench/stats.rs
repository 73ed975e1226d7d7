//! Latency samples and their percentiles. The bench takes at most a few thousand samples per
//! series, so it keeps them all and reads exact nearest-rank percentiles off the sorted list
//! instead of approximating with buckets.

use std::time::Duration;

use serde_json::{Value, json};

/// One series of timings (one RPC, or one floor phase).
#[derive(Debug, Default, Clone)]
pub struct Series {
    samples: Vec<Duration>,
    errors: usize,
}

/// The summary the report prints. Times in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    pub count: usize,
    pub errors: usize,
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
    pub mean: f64,
}

impl Series {
    pub fn ok(&mut self, d: Duration) {
        self.samples.push(d);
    }

    pub fn err(&mut self) {
        self.errors += 1;
    }

    pub fn errors(&self) -> usize {
        self.errors
    }

    pub fn merge(&mut self, other: Series) {
        self.samples.extend(other.samples);
        self.errors += other.errors;
    }

    pub fn summary(&self) -> Summary {
        let mut sorted = self.samples.clone();
        sorted.sort_unstable();
        let total: Duration = sorted.iter().sum();
        Summary {
            count: sorted.len() + self.errors,
            errors: self.errors,
            p50: ms(percentile(&sorted, 50.0)),
            p95: ms(percentile(&sorted, 95.0)),
            p99: ms(percentile(&sorted, 99.0)),
            max: ms(sorted.last().copied().unwrap_or_default()),
            mean: if sorted.is_empty() {
                0.0
            } else {
                ms(total) / sorted.len() as f64
            },
        }
    }
}

/// Nearest-rank percentile of a sorted slice (zero for an empty one).
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

impl Summary {
    /// Completed calls per second of the cycle's wall time.
    pub fn throughput(&self, wall: Duration) -> f64 {
        let secs = wall.as_secs_f64();
        if secs <= 0.0 {
            0.0
        } else {
            (self.count - self.errors) as f64 / secs
        }
    }

    pub fn to_json(self, wall: Option<Duration>) -> Value {
        let mut v = json!({
            "count": self.count,
            "errors": self.errors,
            "p50_ms": round(self.p50),
            "p95_ms": round(self.p95),
            "p99_ms": round(self.p99),
            "max_ms": round(self.max),
            "mean_ms": round(self.mean),
        });
        if let Some(w) = wall {
            v["throughput_per_s"] = json!(round(self.throughput(w)));
        }
        v
    }
}

/// Three decimals: microsecond resolution is all a millisecond figure needs.
pub fn round(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(ms: &[u64]) -> Series {
        let mut s = Series::default();
        for m in ms {
            s.ok(Duration::from_millis(*m));
        }
        s
    }

    #[test]
    fn nearest_rank_percentiles() {
        let s = series(&(1..=100).collect::<Vec<_>>()).summary();
        assert_eq!((s.p50, s.p95, s.p99, s.max), (50.0, 95.0, 99.0, 100.0));
        let one = series(&[7]).summary();
        assert_eq!((one.p50, one.p99), (7.0, 7.0));
    }

    #[test]
    fn empty_and_errors() {
        let mut s = Series::default();
        s.err();
        let sum = s.summary();
        assert_eq!((sum.count, sum.errors, sum.p50), (1, 1, 0.0));
        assert_eq!(sum.throughput(Duration::from_secs(1)), 0.0);
    }
}
