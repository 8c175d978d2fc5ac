//! The machine's processes, seen in `/proc`: how a scenario proves that
//! nothing of a command survived (when the backend runs its commands on
//! this machine), and the unique markers those commands carry.

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

/// Live processes of this machine (zombies excluded, this process
/// excluded) whose command line contains `marker`, each as
/// `pid [state]: command line`.
pub fn survivors(marker: &str) -> Vec<String> {
    let me = std::process::id().to_string();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.bytes().all(|b| b.is_ascii_digit()) || name == me {
            continue;
        }
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if !cmdline.contains(marker) {
            continue;
        }
        // The state follows the parenthesised command name in `stat`.
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let state = stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.get(..1))
            .unwrap_or("");
        if matches!(state, "Z" | "X" | "") {
            continue;
        }
        found.push(format!("{name} [{state}]: {}", cmdline.trim_end()));
    }
    found
}
