//! A sandbox's disk budget where it has no disk of its own (issue 37 item
//! 6: "a sandbox never fills the host's disk unnoticed").
//!
//! Where the server can mount no disk per sandbox (see
//! [`crate::storage::disk`], "Elsewhere"), a sandbox's files go to the
//! data directory's file system without a size limit. The size a disk
//! would have had (`--sandbox-disk`, or its default) is then a budget: a
//! thread of the server measures every sandbox root of the data directory
//! every [`INTERVAL`] (the blocks its files take, each inode once, without
//! crossing into another file system), and while a sandbox's last
//! measured usage is over its budget no new command starts in it: both
//! faces answer 429 `disk_budget`, naming its usage, the budget and what
//! to do. Commands already running go on (the kernel cannot stop a write
//! without a quota), so a sandbox may exceed its budget by what it writes
//! within one interval; it is noticed, never unbounded in silence.

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How often every sandbox root under a budget is measured.
pub const INTERVAL: Duration = Duration::from_secs(2);

/// The code of a command refused over a sandbox's disk budget.
pub const DISK_BUDGET: &str = "disk_budget";

/// The disk budget of one server's sandboxes: the budget, and the last
/// measured usage of each sandbox root of its data directory. The server
/// owns it ([`DiskBudget::start`]); its measuring thread ends with
/// [`DiskBudget::stop`] or once the server dropped it.
#[derive(Debug)]
pub struct DiskBudget {
    /// The data directory whose sandbox roots are measured.
    data_dir: PathBuf,
    /// Bytes each sandbox may take.
    budget: u64,
    /// The last measured usage of each sandbox root, in bytes.
    usage: Mutex<HashMap<PathBuf, u64>>,
    /// Set by [`DiskBudget::stop`] (a shutdown).
    stopped: AtomicBool,
}

impl DiskBudget {
    /// Puts every sandbox of `data_dir` under a budget of `budget` bytes
    /// and starts measuring them (until [`DiskBudget::stop`]).
    pub fn start(data_dir: &Path, budget: u64) -> Arc<DiskBudget> {
        let this = Arc::new(DiskBudget {
            data_dir: data_dir.to_path_buf(),
            budget,
            usage: Mutex::new(HashMap::new()),
            stopped: AtomicBool::new(false),
        });
        let measured = Arc::downgrade(&this);
        let _ = std::thread::Builder::new()
            .name("createos-local-disk-budget".into())
            .spawn(move || loop {
                let Some(this) = measured.upgrade().filter(|b| !b.stopped()) else {
                    return;
                };
                let usage = measure_all(&this.data_dir);
                *this.usage.lock().unwrap_or_else(|p| p.into_inner()) = usage;
                drop(this);
                std::thread::sleep(INTERVAL);
            });
        this
    }

    fn stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }

    /// Stops measuring (a shutdown): nothing is refused any more.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
        self.usage.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    /// `Err` (429 `disk_budget`) while the sandbox whose root is `root`
    /// was last measured over its budget.
    pub fn admit(&self, root: &Path) -> Result<(), crate::trees::budgets::Refusal> {
        if self.stopped() {
            return Ok(());
        }
        let used = self
            .usage
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(root)
            .copied()
            .unwrap_or(0);
        if used <= self.budget {
            return Ok(());
        }
        Err(crate::trees::budgets::Refusal {
            code: DISK_BUDGET,
            message: format!(
                "this sandbox's files take {} MiB, over its disk budget of {} MiB \
                 (--sandbox-disk; this host gives sandboxes no disk of their own, see the \
                 server's startup line); no command was started: shrink its files through the \
                 Files API (a PUT of an empty body truncates one) or delete the sandbox, then \
                 retry (usage is measured every {} s)",
                used >> 20,
                self.budget >> 20,
                INTERVAL.as_secs()
            ),
        })
    }
}

/// The usage of every sandbox root directly under `data_dir` (names not
/// starting with `.`).
fn measure_all(data_dir: &Path) -> HashMap<PathBuf, u64> {
    let mut usage = HashMap::new();
    let Ok(entries) = std::fs::read_dir(data_dir) else {
        return usage;
    };
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let root = entry.path();
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            usage.insert(root.clone(), usage_of(&root));
        }
    }
    usage
}

/// The bytes the files under `root` take on its file system: allocated
/// blocks, each inode once, not crossing into other file systems, never
/// following symbolic links. What cannot be read counts as nothing.
pub fn usage_of(root: &Path) -> u64 {
    let Ok(top) = std::fs::symlink_metadata(root) else {
        return 0;
    };
    let device = top.dev();
    let mut seen = HashSet::new();
    let mut total = top.blocks() * 512;
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(meta) = entry.metadata() else {
                continue;
            };
            if meta.dev() != device {
                continue;
            }
            if meta.nlink() > 1 && !meta.is_dir() && !seen.insert(meta.ino()) {
                continue;
            }
            total = total.saturating_add(meta.blocks() * 512);
            if meta.is_dir() {
                stack.push(entry.path());
            }
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_server_keeps_its_own_budget() {
        let dir = std::env::temp_dir().join(format!(
            "disk-budget-two-{}-{}",
            std::process::id(),
            crate::util::random_hex(4)
        ));
        let root = dir.join("sb-a");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::write(root.join("f"), vec![1u8; 1 << 20]).unwrap();
        let one = DiskBudget::start(&dir, 0);
        let other = DiskBudget::start(&dir, 0);
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while one.admit(&root).is_ok() || other.admit(&root).is_ok() {
            assert!(std::time::Instant::now() < deadline, "never measured");
            std::thread::sleep(Duration::from_millis(10));
        }
        other.stop();
        assert!(other.admit(&root).is_ok(), "a stopped budget refuses");
        assert!(
            one.admit(&root).is_err(),
            "another server's stop ended this one's budget"
        );
        one.stop();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn usage_counts_blocks_once_per_inode() {
        let dir = std::env::temp_dir().join(format!(
            "disk-budget-{}-{}",
            std::process::id(),
            crate::util::random_hex(4)
        ));
        std::fs::create_dir_all(dir.join("a")).unwrap();
        std::fs::write(dir.join("a/f"), vec![1u8; 1 << 20]).unwrap();
        std::fs::hard_link(dir.join("a/f"), dir.join("g")).unwrap();
        std::os::unix::fs::symlink("/usr", dir.join("l")).unwrap();
        let used = usage_of(&dir);
        assert!(
            (1 << 20..2 << 20).contains(&used),
            "1 MiB written once, linked twice: {used}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
