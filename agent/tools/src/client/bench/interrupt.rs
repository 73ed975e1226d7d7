//! Ctrl-C in the bench: stop gracefully, so that the clean-up knows every volume a call was made
//! for, and let a second and third Ctrl-C cut it short.

use std::sync::atomic::{AtomicBool, Ordering};

/// Set by the first Ctrl-C: `par` starts no new item, and what is in flight ends, so that the
/// clean-up after it knows every volume a call was made for.
pub static STOPPING: AtomicBool = AtomicBool::new(false);

pub fn stopping() -> bool {
    STOPPING.load(Ordering::SeqCst)
}

pub const INTERRUPTED: &str = "interrupted";

/// Ctrl-C, listened for from the start (once a listener is installed the signal no longer ends
/// the process). The first stops the bench gracefully: no new call is started, those in flight
/// end (each within its deadline), so the clean-up after it knows every volume a call was made
/// for. A second stops waiting for them: the clean-up then runs at once, and a call still in
/// flight may finish after it. A third exits at once, leaving whatever is left.
pub struct Interrupts {
    pub first: tokio::sync::watch::Receiver<bool>,
    pub second: tokio::sync::watch::Receiver<bool>,
}

pub fn interrupted() -> Interrupts {
    let (first_tx, first) = tokio::sync::watch::channel(false);
    let (second_tx, second) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            STOPPING.store(true, Ordering::SeqCst);
            let _ = first_tx.send(true);
            eprintln!(
                "stopping: the calls in flight end, then everything is undone (Ctrl-C again: undo at once)"
            );
        }
        if tokio::signal::ctrl_c().await.is_ok() {
            let _ = second_tx.send(true);
            eprintln!("undoing now (Ctrl-C again: exit at once, leaving what is left)");
        }
        if tokio::signal::ctrl_c().await.is_ok() {
            eprintln!("error: bench: interrupted three times; volumes and mounts may be left");
            std::process::exit(130);
        }
    });
    Interrupts { first, second }
}

pub async fn until(mut interrupted: tokio::sync::watch::Receiver<bool>) {
    if interrupted.wait_for(|i| *i).await.is_err() {
        std::future::pending::<()>().await;
    }
}
