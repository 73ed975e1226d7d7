//! Running external tools (mkfs, e2fsck, resize2fs, xfs_growfs) with a
//! deadline. Blocking: call it from `spawn_blocking`.

mod spawn;
mod supervise;

use std::ffi::OsStr;
use std::os::unix::process::ExitStatusExt;
use std::sync::RwLock;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use supervise::{Ended, supervise};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandOutput {
    /// The exit code; non-zero is not an error here because its meaning is
    /// tool-specific (e.g. e2fsck's 1 means "errors corrected").
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

use ebs_node_core::seam::CommandError;

/// Held (shared) by every spawn from clone until its child lets it go (at exec). A child gets a
/// copy of every descriptor of the agent, exclusive device claims and handles inside mounts of
/// other threads included, and closes them before that (close_range; at exec itself on a kernel
/// without it). See `host::device::Claim` and `mount::ops::unmount`.
static SPAWNING: RwLock<()> = RwLock::new(());

/// Runs `f` while no tool is being spawned: every spawn begun before has let its caller go, and
/// none starts until `f` returns, so a descriptor opened and closed inside `f` never lives in a
/// child. Spawns are short (clone to exec), so is the wait; `f` must be short too.
pub fn without_spawns<T>(f: impl FnOnce() -> T) -> T {
    let _exclusive = SPAWNING.write().unwrap_or_else(|p| p.into_inner());
    f()
}

/// Tries `attempt` until a child being spawned no longer holds it up (`held`): once every spawn
/// then in flight has let its caller go, by which time its child closed its copies of our
/// descriptors (close_range), then every 200 µs for 20 ms at most, for a kernel or seccomp filter
/// without close_range (the copies then go at exec, a moment later) and for another thread's
/// short use. Returns the last result. The tries run outside the barrier, so a slow one never
/// holds up a spawn.
pub fn past_spawns<T>(mut attempt: impl FnMut() -> T, held: impl Fn(&T) -> bool) -> T {
    without_spawns(|| ());
    let mut result = attempt();
    for _ in 0..100 {
        if !held(&result) {
            break;
        }
        std::thread::sleep(Duration::from_micros(200));
        result = attempt();
    }
    result
}

/// Runs `program` with `args`, `LC_ALL=C` (parsable messages) and stdin from
/// /dev/null, killing it with SIGKILL if it runs longer than `timeout`.
pub fn run<P: AsRef<OsStr>, S: AsRef<OsStr>>(
    program: P,
    args: &[S],
    timeout: Duration,
) -> Result<CommandOutput, CommandError> {
    let start = Instant::now();
    let program_os = program.as_ref();
    let program = program_os.to_string_lossy();
    let spawning = SPAWNING.read().unwrap_or_else(|p| p.into_inner());
    // Returns once the child has exec'd (or failed to): its copies of our descriptors are closed.
    let spawned = spawn::spawn(program_os, args);
    drop(spawning);
    let spawn::Spawned {
        tool: mut child,
        stdout,
        stderr,
    } = spawned.map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound => CommandError::NotFound {
            program: program.clone().into_owned(),
        },
        _ => CommandError::Spawn {
            program: program.clone().into_owned(),
            source,
        },
    })?;
    let (stdout, stderr) = (Some(stdout), Some(stderr));
    let (status, stdout, stderr) = match supervise(&mut child, stdout, stderr, start + timeout) {
        Ok(Ended::Exited {
            status,
            stdout,
            stderr,
        }) => (status, stdout, stderr),
        Ok(Ended::TimedOut) => {
            kill_and_reap(&mut child);
            return Err(CommandError::Timeout {
                program: program.clone().into_owned(),
                after: timeout,
            });
        }
        Err(source) => {
            kill_and_reap(&mut child);
            return Err(CommandError::Spawn {
                program: program.clone().into_owned(),
                source,
            });
        }
    };
    let elapsed = start.elapsed();

    match (status.code(), status.signal()) {
        (Some(code), _) => Ok(CommandOutput {
            code,
            stdout,
            stderr,
            elapsed,
        }),
        (None, signal) => Err(CommandError::Killed {
            program: program.clone().into_owned(),
            signal: signal.unwrap_or(0),
        }),
    }
}

fn kill_and_reap(child: &mut spawn::Tool) {
    // The group id equals the child's pid (its own group). The child is not reaped yet, so the
    // pid cannot have been reused.
    if let Ok(pid) = i32::try_from(child.id()) {
        let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
    }
    child.kill();
    let _ = child.wait();
}

#[cfg(test)]
mod tests {
    use super::supervise::CAPTURE_LIMIT;
    use super::*;
    use std::process::{Command, Stdio};

    const LONG: Duration = Duration::from_secs(10);

    #[test]
    fn captures_output_and_exit_code() {
        let out = run("sh", &["-c", "echo out; echo err >&2; exit 3"], LONG).unwrap();
        assert_eq!(out.code, 3);
        assert_eq!(out.stdout, "out\n");
        assert_eq!(out.stderr, "err\n");
        assert!(out.elapsed < LONG);
    }

    #[test]
    fn environment_and_stdin() {
        let out = run("sh", &["-c", "echo $LC_ALL; cat; echo done"], LONG).unwrap();
        assert_eq!(out.stdout, "C\ndone\n");
        assert_eq!(out.code, 0);
    }

    #[test]
    fn accepts_os_str_args() {
        let args = [
            OsStr::new("-c"),
            OsStr::new("printf '%s' \"$0\""),
            OsStr::new("x y"),
        ];
        assert_eq!(run("sh", &args, LONG).unwrap().stdout, "x y");
    }

    #[test]
    fn timeout_kills_and_reaps() {
        let start = Instant::now();
        let err = run("sleep", &["30"], Duration::from_millis(200)).unwrap_err();
        assert!(
            matches!(err, CommandError::Timeout { ref program, after } if program == "sleep" && after == Duration::from_millis(200))
        );
        assert!(start.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn timeout_kills_grandchildren_holding_pipes() {
        let start = Instant::now();
        let err = run(
            "sh",
            &["-c", "sleep 30; echo never"],
            Duration::from_millis(200),
        )
        .unwrap_err();
        assert!(matches!(err, CommandError::Timeout { .. }));
        assert!(start.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn stray_background_process_does_not_hang() {
        let start = Instant::now();
        let out = run("sh", &["-c", "sleep 3 & echo started"], LONG).unwrap();
        assert_eq!(out.stdout, "started\n");
        assert!(start.elapsed() < Duration::from_secs(3));
    }

    /// The agent dies (SIGKILL) while a tool runs: the tool dies with it.
    #[test]
    fn tools_die_with_the_agent() {
        if let Ok(marker) = std::env::var("EBS_TEST_PDEATH_CHILD") {
            let _ = run("sleep", &[marker.as_str()], Duration::from_secs(120));
            return;
        }
        let marker = format!("300.{}", std::process::id());
        let running = |m: &str| {
            std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
                std::fs::read(e.path().join("cmdline")).is_ok_and(|c| {
                    c.starts_with(b"sleep\0") && c.ends_with(format!("{m}\0").as_bytes())
                })
            })
        };
        let mut agent = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "command::tests::tools_die_with_the_agent",
                "--test-threads=1",
            ])
            .env("EBS_TEST_PDEATH_CHILD", &marker)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let start = Instant::now();
        while !running(&marker) {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "the tool never started"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        agent.kill().unwrap();
        agent.wait().unwrap();
        let start = Instant::now();
        while running(&marker) {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "the tool outlived the agent that started it"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn missing_program() {
        // An absolute path: a bare name's error depends on PATH (an
        // unreadable PATH entry turns ENOENT into EACCES).
        let missing = "/nonexistent/definitely-not-a-real-tool";
        let err = run(missing, &[] as &[&str], LONG).unwrap_err();
        assert!(matches!(err, CommandError::NotFound { ref program } if program == missing));
        assert!(err.to_string().contains(missing));
    }

    #[test]
    fn non_executable_is_spawn_error() {
        let err = run("/dev/null", &[] as &[&str], LONG).unwrap_err();
        assert!(matches!(err, CommandError::Spawn { .. }), "{err:?}");
    }

    #[test]
    fn killed_by_signal() {
        let err = run("sh", &["-c", "kill -9 $$"], LONG).unwrap_err();
        assert!(
            matches!(err, CommandError::Killed { signal: 9, .. }),
            "{err:?}"
        );
    }

    #[test]
    fn large_output_is_capped_without_deadlock() {
        let script = "head -c 1000000 /dev/zero | tr '\\0' a; echo; echo last line; \
                      head -c 300000 /dev/zero | tr '\\0' b >&2";
        let out = run("sh", &["-c", script], LONG).unwrap();
        assert_eq!(out.code, 0);
        let half = CAPTURE_LIMIT / 2;
        assert!(out.stdout.starts_with(&"a".repeat(half)));
        assert!(out.stdout.contains("\n[... 934475 bytes omitted ...]\n"));
        assert!(out.stdout.ends_with("a\nlast line\n"));
        assert!(out.stdout.len() < CAPTURE_LIMIT + 100);
        assert!(out.stderr.contains("[... 234464 bytes omitted ...]"));
    }

    #[test]
    fn program_may_be_a_path_and_args_a_vec() {
        let args: Vec<String> = vec!["-c".into(), "exit 0".into()];
        let out = run(std::path::Path::new("/bin/sh"), &args, LONG).unwrap();
        assert_eq!(out.code, 0);
    }

    #[test]
    fn invalid_utf8_is_lossy() {
        let out = run("sh", &["-c", "printf 'a\\377b'"], LONG).unwrap();
        assert_eq!(out.stdout, "a\u{fffd}b");
    }
}
