//! What the workspace's test suites share, written once (issue 28):
//!
//! - [`components`]: where `./build.sh` puts each provider component, and
//!   the component loaded once per test binary;
//! - [`procs`]: the machine's processes seen in `/proc` (how a test proves
//!   nothing of a command survived) and unique markers to find them by;
//! - [`requests`]: the `ExecuteRequest` (and `AcquireRequest`) builders;
//! - [`cli`]: the `sandbox` CLI as a test runs it ([`sandbox_cli!`]);
//! - [`http`]: a loopback HTTP server of one text and a plain `GET`;
//! - [`local`]: the engine in this process and a host runtime of one
//!   provider against it;
//! - [`skips`]: tests that cannot run on this machine, listed for CI.
//!
//! Used by the conformance kit, the provider suites
//! (`providers/*/tests`), the host's and the engine's suites.

#![deny(missing_docs)]

pub mod cli;
pub mod components;
pub mod http;
pub mod local;
pub mod procs;
pub mod requests;
pub mod skips;

pub use components::{built_component, workspace_dir};
pub use requests::{acquire, bash, command, sh, RequestExt};
pub use skips::skipped;

use std::time::{Duration, Instant};

/// Waits up to `bound` for `done`, looking every 20 ms; whether it came
/// true (looked at once more at the end).
pub fn eventually(bound: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + bound;
    while Instant::now() < deadline {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    done()
}
