//! A bind of a device node that only another mount namespace shows: what a container's runtime
//! leaves when it binds a volume's device into the container, or an operator's `unshare`. A bind
//! does not open the device, so the kernel frees its number at a detach all the same; only the
//! other namespace's mount table tells the bind is there.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// A process in a mount namespace of its own (private propagation) that binds `source` at `at`
/// there only; killed by its pid on drop, which ends the namespace and its bind.
pub struct BoundElsewhere {
    child: Child,
    pub at: PathBuf,
}

impl BoundElsewhere {
    /// `keep`: the calling test's scratch directory (the copies of the other tests' mounts are
    /// dropped, so their unstages are not refused as "mounted elsewhere").
    pub fn new(keep: &Path, source: &Path, at: &Path) -> BoundElsewhere {
        std::fs::write(at, b"").expect("the bind's target file");
        let child = Command::new("unshare")
            .args(["-m", "--propagation", "private", "sh", "-c"])
            .arg(format!(
                "{}; mount --bind '{}' '{}' && exec sleep 600",
                crate::drop_other_tests_mounts(keep),
                source.display(),
                at.display()
            ))
            .spawn()
            .expect("unshare");
        let bound = BoundElsewhere {
            child,
            at: at.to_path_buf(),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        let at_text = at.display().to_string();
        while std::fs::read_to_string(format!("/proc/{}/mountinfo", bound.child.id()))
            .map_or(true, |m| !m.contains(&at_text))
        {
            assert!(
                Instant::now() < deadline,
                "the other namespace never showed its bind at {at_text}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        bound
    }

    /// The bound device as the other namespace sees it.
    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/{}/root", self.child.id()))
            .join(self.at.strip_prefix("/").unwrap_or(&self.at))
    }

    /// Ends the namespace (and its bind) now.
    pub fn end(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for BoundElsewhere {
    fn drop(&mut self) {
        self.stop();
    }
}
