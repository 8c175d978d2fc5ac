//! Issue 40: a successor (or a DELETE trying again) proves a dead
//! engine's sandbox gone with fresh `/proc` scans. With the engine out of
//! descriptors those scans could not be made, and a scan that failed
//! counted as empty: a sandbox whose namespace still ran was called gone.
//! A file of its own: the test exhausts the descriptors of its whole
//! process.

use std::process::Command;
use std::time::{Duration, Instant};

use sandbox_engine::storage::records::{namespace_identity, Face, Record, TreeId, Verdict};

#[test]
fn a_record_is_never_proven_gone_by_a_scan_that_cannot_be_made() {
    // `sleep` as PID 1 of a PID namespace of its own.
    let mut outer = Command::new("unshare")
        .args(["--pid", "--fork", "--kill-child", "sleep", "1002"])
        .spawn()
        .expect("unshare");
    let outer_pid = outer.id() as i32;
    let deadline = Instant::now() + Duration::from_secs(20);
    let init: i32 = loop {
        let kids = std::fs::read_to_string(format!("/proc/{outer_pid}/task/{outer_pid}/children"))
            .unwrap_or_default();
        if let Some(pid) = kids.split_whitespace().next().and_then(|p| p.parse().ok()) {
            if namespace_identity(pid).is_some()
                && namespace_identity(pid) != namespace_identity(outer_pid)
            {
                break pid;
            }
        }
        assert!(Instant::now() < deadline, "unshare did not fork");
        std::thread::sleep(Duration::from_millis(10));
    };
    let (dev, ino) = namespace_identity(init).expect("its namespace");
    let stat = std::fs::read_to_string(format!("/proc/{init}/stat")).expect("stat");
    let start: u64 = stat[stat.rfind(')').expect(")") + 2..]
        .split_whitespace()
        .nth(19)
        .and_then(|s| s.parse().ok())
        .expect("start time");
    let record = Record {
        id: "sb-exhausted".into(),
        face: Face::CreateOs,
        root: std::env::temp_dir().join("sb-exhausted"),
        data_dir: std::env::temp_dir(),
        owned_data_dir: false,
        uid: None,
        trees: vec![TreeId::Namespace {
            init_pid: init,
            init_start: Some(start),
            dev: Some(dev),
            ino,
        }],
        deleted: false,
    };
    let mut held = Vec::new();
    while let Ok(f) = std::fs::File::open("/dev/null") {
        held.push(f);
        if held.len() > 1_000_000 {
            break;
        }
    }
    let verdict = sandbox_engine::storage::records::verify(&record, Duration::from_millis(500));
    drop(held);
    let still_runs = namespace_identity(init) == Some((dev, ino));
    let _ = outer.kill();
    let _ = outer.wait();
    assert!(
        !(verdict == Verdict::Gone && still_runs),
        "proven gone while its namespace ran (the scan could not be made)"
    );
}
