//! systemd's sd_notify protocol, without libsystemd: one datagram to $NOTIFY_SOCKET.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};

fn send(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let path = path.to_string_lossy().into_owned();
    let addr = match path.strip_prefix('@') {
        Some(abstract_name) => SocketAddr::from_abstract_name(abstract_name.as_bytes()),
        None => SocketAddr::from_pathname(&path),
    };
    let result = addr.and_then(|addr| {
        let sock = UnixDatagram::unbound()?;
        sock.send_to_addr(state.as_bytes(), &addr)
    });
    if let Err(e) = result {
        tracing::warn!(error = %e, "sd_notify failed");
    }
}

/// Start-up recovery is done and Probe is ready.
pub fn ready() {
    send(&format!(
        "READY=1\nMAINPID={}\nSTATUS=serving",
        std::process::id()
    ));
}

pub fn stopping() {
    send("STOPPING=1");
}

/// Feeds systemd's watchdog at half its interval, when the unit sets WatchdogSec.
pub fn spawn_watchdog() {
    let Some(usec) = std::env::var("WATCHDOG_USEC")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    else {
        return;
    };
    let pid_ok = std::env::var("WATCHDOG_PID")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
        .is_none_or(|p| p == std::process::id());
    if !pid_ok || usec == 0 {
        return;
    }
    let period = std::time::Duration::from_micros(usec / 2);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(period);
        loop {
            tick.tick().await;
            send("WATCHDOG=1");
        }
    });
}
