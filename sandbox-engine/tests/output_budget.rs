//! Issue 40 item 4: finished commands' output is held within one
//! engine-wide budget. 300 finished commands of 1 MB each took the engine
//! from 7 to 301 MB of RSS before retention (per sandbox, by count and
//! age) brought it back. Now the oldest finished output is evicted as soon
//! as the total passes the budget, and a replay of evicted output is the
//! typed 410 of an expired offset. A file of its own: it watches the
//! engine's RSS, which other engines beside it do not disturb, but other
//! tests' load would slow it.

#[path = "common/binary.rs"]
mod binary;

use binary::Engine;
use serde_json::json;

/// The budget the engine is started with.
const BUDGET: u64 = 32 << 20;

/// What RSS may grow beyond the budget: the allocator's own slack, the
/// one journal always kept whole, the HTTP layer's buffers.
const SLACK: u64 = 32 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finished_output_stays_within_one_engine_wide_budget() {
    // Per-sandbox retention out of the way (1000 kept, 10 minutes), so
    // that only the engine-wide budget can bound the memory.
    let engine = Engine::start(
        "output-budget",
        &[
            "--finished-keep",
            "1000",
            "--finished-ttl",
            "600",
            "--finished-output",
            "32M",
        ],
        None,
    );
    let sb = engine.sandbox().await;
    // Warm up: the first commands start the machine and the runtimes.
    for _ in 0..3 {
        let (st, v) = engine
            .call(
                reqwest::Method::POST,
                &format!("/v1/sandboxes/{sb}/exec"),
                Some(json!({"cmd": "/bin/true"})),
            )
            .await;
        assert_eq!(st, 200, "{v}");
    }
    let before = engine.rss();
    let mut peak = before;
    let mut first = None;
    for i in 0..300 {
        let pid = engine.spawn(&sb, "head -c 1000000 /dev/zero").await;
        let (st, v) = engine
            .call(
                reqwest::Method::GET,
                &format!("/v1/sandboxes/{sb}/processes/{pid}/wait?timeout_ms=60000"),
                None,
            )
            .await;
        assert_eq!(st, 200, "{v}");
        assert_eq!(v["data"]["exit_code"], 0, "{v}");
        first.get_or_insert(pid);
        if i % 10 == 9 {
            peak = peak.max(engine.rss());
        }
    }
    let first = first.expect("a first command");
    eprintln!(
        "engine RSS: {} MiB before, {} MiB at most over 300 finished 1 MB commands",
        before >> 20,
        peak >> 20
    );
    assert!(
        peak.saturating_sub(before) <= BUDGET + SLACK,
        "RSS grew by {} MiB with a budget of {} MiB",
        peak.saturating_sub(before) >> 20,
        BUDGET >> 20
    );
    // The first command's output was evicted: its record stays, a replay
    // is the typed 410.
    let (st, v) = engine
        .call(
            reqwest::Method::GET,
            &format!("/v1/sandboxes/{sb}/processes/{first}"),
            None,
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let (st, v) = engine
        .call(
            reqwest::Method::GET,
            &format!("/v1/sandboxes/{sb}/processes/{first}/connect?after=0"),
            None,
        )
        .await;
    assert_eq!(st, 410, "{v}");
    assert_eq!(v["data"]["error"], "output_offset_expired", "{v}");
    let data = engine.data.clone();
    let (ok, err) = engine.stop();
    assert!(ok, "{err}");
    let _ = std::fs::remove_dir_all(data);
}
