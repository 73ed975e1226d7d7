//! Probe under load: the agent's liveness answer while the cycle runs.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ebs_proto::csi::v1 as csi;

use super::cycle::Csi;
use super::stats::Series;

/// Calls Probe every `interval` until stopped, as the livenessprobe sidecar does: on its own
/// connection, and on its own thread and runtime, so that what it measures is the agent's
/// answer, not how busy the bench's own runtime is with the cycle's calls (the sidecar is a
/// process of its own).
pub struct ProbeLoad {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Result<Series, String>>,
}

impl ProbeLoad {
    pub fn start(endpoint: String, interval: Duration, timeout: Duration) -> ProbeLoad {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| format!("Probe runtime: {e}"))?;
                runtime.block_on(probe_until(endpoint, interval, timeout, stop))
            })
        };
        ProbeLoad { stop, thread }
    }

    pub async fn finish(self) -> Result<Series, String> {
        self.stop.store(true, Ordering::Relaxed);
        let thread = self.thread;
        tokio::task::spawn_blocking(move || thread.join())
            .await
            .map_err(|e| e.to_string())?
            .map_err(|_| "the Probe thread panicked".to_string())?
    }
}

async fn probe_until(
    endpoint: String,
    interval: Duration,
    timeout: Duration,
    stop: Arc<AtomicBool>,
) -> Result<Series, String> {
    let c = Csi::new(
        crate::client::connect::channel(&endpoint)
            .await
            .map_err(|e| e.to_string())?,
        timeout,
    );
    let mut series = Series::default();
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        let t = Instant::now();
        match c.identity.clone().probe(c.req(csi::ProbeRequest {})).await {
            Ok(r) if r.get_ref().ready != Some(false) => series.ok(t.elapsed()),
            _ => series.err(),
        }
    }
    Ok(series)
}
