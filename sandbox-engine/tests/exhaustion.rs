//! Issue 40 item 3: at descriptor exhaustion the engine neither spins nor
//! falls silent. Its accept loops (API, toolbox, each sandbox's egress
//! proxy) used to retry `EMFILE` at once: with connections pending on a
//! sandbox's proxy the engine burnt a core, and its API answered nothing.
//! A file of its own: the engine under test runs at its descriptor limit,
//! and its CPU time is measured, which other tests beside it would blur.

#[path = "common/binary.rs"]
mod binary;

use std::io::Write;
use std::time::{Duration, Instant};

use binary::Engine;

/// The engine's descriptor ceiling: enough to start, create a sandbox
/// and start its machine, few enough for a test to use up.
const NOFILE: u64 = 256;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_descriptor_exhaustion_the_engine_backs_off_and_still_answers() {
    if !sandbox_engine::machine::enabled_here() {
        test_support::skipped("no sandbox machines (and so no egress proxy) on this host");
        return;
    }
    let engine = Engine::start(
        "exhaustion",
        &["--egress", "egress-target.invalid:80"],
        Some(NOFILE),
    );
    let sb = engine.sandbox().await;
    // A command that, once the engine is out of descriptors, opens
    // connections to its sandbox's egress proxy and holds them: they wait
    // in the proxy's accept queue, which the engine cannot empty.
    engine
        .spawn(
            &sb,
            "exec python3 -c '
import socket, time
time.sleep(4)
held = []
for _ in range(100):
    try:
        held.append(socket.create_connection((\"127.0.0.1\", 3128), timeout=1))
    except OSError:
        pass
time.sleep(600)
'",
        )
        .await;
    // Use up the engine's descriptors with API connections that have sent
    // half a request (so no first-byte timeout closes them).
    let port: u16 = engine
        .base
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("port");
    let mut held = Vec::new();
    while (engine.descriptors() as u64) < NOFILE - 1 {
        assert!(
            held.len() < 4 * NOFILE as usize,
            "the engine never ran out of descriptors: {} open",
            engine.descriptors()
        );
        for _ in 0..8 {
            let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
            let _ = c.write_all(b"GET /v1/sandboxes HTTP/1.1\r\n");
            held.push(c);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The sandbox's connections come now (4 s after its start) and stay.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (cpu_before, wall) = (engine.cpu(), Instant::now());
    tokio::time::sleep(Duration::from_secs(6)).await;
    let (used, wall) = (engine.cpu() - cpu_before, wall.elapsed());
    // Its API answers something (a 503 is an answer) on a new connection.
    let asked = Instant::now();
    let answer = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client")
        .get(format!("{}/_admin/info", engine.base))
        .header("X-Api-Key", binary::KEY)
        .send()
        .await;
    let waited = asked.elapsed();
    drop(held);
    let (_, stderr) = engine.stop();
    eprintln!(
        "engine CPU at exhaustion: {:.2} s in {:.2} s; answer after {:.2} s",
        used.as_secs_f64(),
        wall.as_secs_f64(),
        waited.as_secs_f64()
    );
    assert!(
        used < wall / 4,
        "the engine spun at descriptor exhaustion: {:.2} s of CPU in {:.2} s; stderr: {stderr}",
        used.as_secs_f64(),
        wall.as_secs_f64()
    );
    let answer = answer.unwrap_or_else(|e| {
        panic!("the API answered nothing at descriptor exhaustion within 30 s: {e}")
    });
    assert!(
        answer.status().is_success() || answer.status().as_u16() == 503,
        "{}",
        answer.status()
    );
}
