//! Where the agent's file descriptors go. Host work (mkfs, fsck, mount, the state file, udev)
//! needs descriptors at unpredictable moments, and a peer must never be able to use them up:
//! every listener caps its connections (the gRPC sockets' caps are applied in `connections`),
//! and the caps together take at most a quarter of RLIMIT_NOFILE, so three quarters always
//! remain for host work however the ports are flooded.
//! The soft limit is first raised to the hard one (systemd's default soft limit is 1024).

use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};

/// How many connections each listener may hold open, derived from the descriptor limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    pub limit: u64,
    /// The metrics port: scrapers use one or two connections; the rest are closed at once.
    pub metrics_connections: usize,
    /// Each gRPC socket (CSI, CSI-Addons): further clients wait in the kernel's backlog.
    pub grpc_connections: usize,
}

impl Budget {
    pub fn for_limit(limit: u64) -> Self {
        let peers = usize::try_from(limit / 4).unwrap_or(usize::MAX);
        Budget {
            limit,
            metrics_connections: (peers / 8).clamp(4, 64),
            grpc_connections: (peers * 7 / 16).clamp(8, 256),
        }
    }

    /// What peers can never take: the limit less every listener's cap.
    pub fn reserve(&self) -> u64 {
        let peers = self.metrics_connections + 2 * self.grpc_connections;
        self.limit.saturating_sub(peers as u64)
    }
}

/// Raises RLIMIT_NOFILE's soft limit to its hard limit, logs the budget that follows and returns
/// it. A failure (a hard limit of "unlimited" the kernel refuses, a seccomp filter) keeps the
/// current limit and says so.
pub fn raise_nofile_limit() -> Budget {
    let before = getrlimit(Resource::Nofile);
    let soft = before.current.unwrap_or(u64::MAX);
    let raised = match before.maximum {
        Some(hard) if hard > soft => match setrlimit(
            Resource::Nofile,
            Rlimit {
                current: Some(hard),
                maximum: Some(hard),
            },
        ) {
            Ok(()) => hard,
            Err(e) => {
                tracing::warn!(soft, hard, error = %e, "cannot raise the open-file limit");
                soft
            }
        },
        _ => soft,
    };
    let budget = Budget::for_limit(raised);
    tracing::info!(
        before = soft,
        limit = raised,
        metrics_connections = budget.metrics_connections,
        grpc_connections = budget.grpc_connections,
        reserved_for_host_work = budget.reserve(),
        "open-file limit"
    );
    if budget.reserve() < 512 {
        tracing::warn!(
            limit = raised,
            "open-file limit is low: raise LimitNOFILE (systemd) or the container's nofile ulimit"
        );
    }
    budget
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quarter_of_a_small_limit_goes_to_peers() {
        let b = Budget::for_limit(1024);
        assert_eq!((b.metrics_connections, b.grpc_connections), (32, 112));
        assert_eq!(b.reserve(), 768);
    }

    #[test]
    fn large_limits_keep_small_caps_and_tiny_ones_keep_a_few_slots() {
        let b = Budget::for_limit(1 << 20);
        assert_eq!((b.metrics_connections, b.grpc_connections), (64, 256));
        let b = Budget::for_limit(64);
        assert_eq!((b.metrics_connections, b.grpc_connections), (4, 8));
        assert_eq!(Budget::for_limit(8).reserve(), 0);
    }
}
