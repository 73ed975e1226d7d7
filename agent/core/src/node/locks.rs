//! Operation guards keyed by a string: one per volume id (`NodeCtx::locks`: a second call on a
//! volume while one is in flight is refused, which the daemon answers ABORTED, CSI's "operation
//! pending") and one per device number (`NodeCtx::device_locks`). Different keys run in
//! parallel.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

#[derive(Default, Clone)]
pub struct VolumeLocks {
    held: Arc<Mutex<HashSet<String>>>,
}

/// Held for the whole operation, including the blocking host work, so that a cancelled call
/// keeps the volume locked until its work reaches the end.
pub struct VolumeGuard {
    held: Arc<Mutex<HashSet<String>>>,
    volume: String,
}

impl VolumeLocks {
    pub fn try_lock(&self, volume: &str) -> Option<VolumeGuard> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        if !held.insert(volume.to_string()) {
            return None;
        }
        Some(VolumeGuard {
            held: Arc::clone(&self.held),
            volume: volume.to_string(),
        })
    }

    pub fn in_flight(&self) -> usize {
        self.held.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

impl Drop for VolumeGuard {
    fn drop(&mut self) {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        held.remove(&self.volume);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_lock_on_same_volume_fails_until_release() {
        let locks = VolumeLocks::default();
        let a = locks.try_lock("v1").unwrap();
        assert!(locks.try_lock("v1").is_none());
        assert!(locks.try_lock("v2").is_some());
        drop(a);
        assert!(locks.try_lock("v1").is_some());
    }
}
