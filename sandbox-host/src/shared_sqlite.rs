//! Opening a SQLite file that several `sandbox` processes share (the lease
//! store, the request pacer's ledger).
//!
//! Each connection waits up to [`BUSY_WAIT`] for another process's write.
//! Turning a fresh file to WAL is the one step SQLite may refuse at once
//! ("database is locked") while another process is doing the same, without
//! waiting: that step is retried here until the same wait is spent.

use std::path::Path;
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use rusqlite::{Connection, ErrorCode};

/// How long a statement waits for another process before it fails.
pub const BUSY_WAIT: Duration = Duration::from_secs(5);

/// Opens `path` (`what` names it in errors) in WAL mode, waiting for the
/// processes that open or write it at the same time.
pub fn open_shared(path: &Path, what: &str) -> Result<Connection> {
    let conn =
        Connection::open(path).with_context(|| format!("cannot open {what} {}", path.display()))?;
    conn.busy_timeout(BUSY_WAIT)?;
    let started = Instant::now();
    loop {
        match conn.pragma_update(None, "journal_mode", "WAL") {
            Ok(()) => return Ok(conn),
            Err(e) if is_busy(&e) && started.elapsed() < BUSY_WAIT => {
                sleep(Duration::from_millis(5))
            }
            Err(e) => return Err(e).with_context(|| busy_note(path, what)),
        }
    }
}

/// What to say when another process kept `path` longer than [`BUSY_WAIT`].
pub fn busy_note(path: &Path, what: &str) -> String {
    format!(
        "{what} {} stayed locked by another process for more than {} s; retry, and if it \
         persists look for a stuck `sandbox` process using this data directory",
        path.display(),
        BUSY_WAIT.as_secs()
    )
}

fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
    )
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::sync::{Arc, Barrier};

    use crate::leases::sqlite::SqliteLeases;
    use crate::network::request_pacer::RequestPacer;

    /// Eight openers start at once on a fresh file, twenty times over; each
    /// must wait its turn, none may fail with "database is locked".
    fn openers_take_turns(name: &str, open: fn(&PathBuf) -> anyhow::Result<()>) {
        for round in 0..20 {
            let path = std::env::temp_dir().join(format!(
                "sandbox-{name}-{}-{round}.sqlite",
                std::process::id()
            ));
            let _ = std::fs::remove_file(&path);
            let start = Arc::new(Barrier::new(8));
            let openers: Vec<_> = (0..8)
                .map(|_| {
                    let (path, start) = (path.clone(), start.clone());
                    std::thread::spawn(move || {
                        start.wait();
                        open(&path)
                    })
                })
                .collect();
            for opener in openers {
                if let Err(e) = opener.join().unwrap() {
                    panic!("{name}, round {round}: {e:#}");
                }
            }
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
            }
        }
    }

    /// `sandbox` processes that start together open one fresh lease store.
    #[test]
    fn many_openers_of_one_fresh_lease_store_take_turns() {
        openers_take_turns("openers-leases", |path| {
            SqliteLeases::open(path).map(|_| ())
        });
    }

    /// `sandbox` processes that start together open one fresh pacer ledger.
    #[test]
    fn many_openers_of_one_fresh_pacer_ledger_take_turns() {
        openers_take_turns("openers-pacer", |path| RequestPacer::open(path).map(|_| ()));
    }
}
