//! The machine's processes, seen in `/proc`: how a test (or a conformance
//! scenario) proves that nothing of a command survived, and the unique
//! markers those commands carry.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A marker no other process of the machine carries: `kitmark` followed by
/// this process's id, a counter and the clock (letters and digits only, so
/// it needs no quoting and survives any shell).
pub fn unique_marker() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        "kitmark{}x{}x{nanos}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// One process of the machine, as `/proc` shows it.
#[derive(Clone, Debug)]
pub struct Process {
    /// Its id.
    pub pid: u32,
    /// Its state letter (`R`, `S`, `Z`...), empty when `/proc` had none.
    pub state: String,
    /// Its command line, arguments NUL-separated as the kernel keeps them.
    pub cmdline: Vec<u8>,
}

impl Process {
    /// Whether it is a zombie (or dead, or its state could not be read):
    /// nothing of it runs any more.
    pub fn is_zombie(&self) -> bool {
        matches!(self.state.as_str(), "Z" | "X" | "")
    }

    /// Whether its command line contains `needle`.
    pub fn cmdline_contains(&self, needle: &str) -> bool {
        contains(&self.cmdline, needle)
    }

    /// Whether its environment contains `needle` (false when unreadable).
    pub fn environ_contains(&self, needle: &str) -> bool {
        std::fs::read(format!("/proc/{}/environ", self.pid)).is_ok_and(|e| contains(&e, needle))
    }

    /// Its command line with spaces between the arguments.
    pub fn command_line(&self) -> String {
        String::from_utf8_lossy(&self.cmdline)
            .replace('\0', " ")
            .trim_end()
            .to_string()
    }
}

impl std::fmt::Display for Process {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} [{}]: {}", self.pid, self.state, self.command_line())
    }
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    let needle = needle.as_bytes();
    needle.is_empty() || haystack.windows(needle.len()).any(|w| w == needle)
}

/// Every process of the machine but this one (zombies included), each
/// read once; a process that exits while being read is left out.
pub fn all() -> Vec<Process> {
    let me = std::process::id();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        // The state follows the parenthesised command name in `stat`.
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().get(..1))
            .unwrap_or("")
            .to_string();
        found.push(Process {
            pid,
            state,
            cmdline,
        });
    }
    found
}

/// The live processes (zombies excluded, this process excluded).
pub fn live() -> Vec<Process> {
    all().into_iter().filter(|p| !p.is_zombie()).collect()
}

/// Live processes whose command line contains `marker`, each as
/// `pid [state]: command line`.
pub fn survivors(marker: &str) -> Vec<String> {
    live()
        .into_iter()
        .filter(|p| p.cmdline_contains(marker))
        .map(|p| p.to_string())
        .collect()
}

/// Pids of live processes whose command line contains `needle`.
pub fn containing(needle: &str) -> Vec<u32> {
    live()
        .into_iter()
        .filter(|p| p.cmdline_contains(needle))
        .map(|p| p.pid)
        .collect()
}

/// Pids of live processes whose command line is exactly `words`.
pub fn exact(words: &[&str]) -> Vec<u32> {
    let wanted: Vec<u8> = words
        .iter()
        .flat_map(|w| [w.as_bytes(), b"\0"].concat())
        .collect();
    live()
        .into_iter()
        .filter(|p| p.cmdline == wanted)
        .map(|p| p.pid)
        .collect()
}

/// Pids of live processes whose command line or environment contains
/// `marker`.
pub fn marked(marker: &str) -> Vec<u32> {
    live()
        .into_iter()
        .filter(|p| p.cmdline_contains(marker) || p.environ_contains(marker))
        .map(|p| p.pid)
        .collect()
}

/// The descriptor numbers a shell printed with `ls -l /proc/$$/fd`, in
/// order.
pub fn fd_numbers(listing: &str) -> Vec<i32> {
    let mut fds: Vec<i32> = listing
        .lines()
        .filter(|l| l.contains(" -> "))
        .filter_map(|l| {
            l.split(" -> ")
                .next()?
                .split_whitespace()
                .last()?
                .parse()
                .ok()
        })
        .collect();
    fds.sort_unstable();
    fds
}
