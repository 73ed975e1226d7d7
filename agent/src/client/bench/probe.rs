//! Probe under load: the agent's liveness answer while the cycle runs.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ebs_proto::csi::v1 as csi;
use tonic::transport::Channel;

use super::cycle::Csi;
use super::stats::Series;

/// Calls Probe every `interval` on its own connection until stopped, as the livenessprobe
/// sidecar does (it opens its own connection too).
pub struct ProbeLoad {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Series>,
}

impl ProbeLoad {
    pub fn start(ch: Channel, interval: Duration, timeout: Duration) -> ProbeLoad {
        let stop = Arc::new(AtomicBool::new(false));
        let task = {
            let stop = Arc::clone(&stop);
            tokio::spawn(async move {
                let c = Csi::new(ch, timeout);
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
                series
            })
        };
        ProbeLoad { stop, task }
    }

    pub async fn finish(self) -> Series {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap_or_default()
    }
}
