//! Real-process torture: the component under wasmtime, against the local
//! backend running real processes, in both of its isolation modes. Each
//! command builds a hostile process tree (a bounded fork bomb that spawns
//! more on SIGTERM, SIGTERM-ignoring trees, setsid double-forks, a command
//! that closes its stdout and keeps running); the component's confirmed
//! cleanup (a `cancelled` or `timed-out` outcome, both only after
//! `tree_exited: true`) must leave no survivor in `/proc`.
//!
//! Every process of a scenario carries its tag (a unique number) in its
//! command line, so the scan also finds forked subshells and bwrap itself.
//! No timing is asserted: readiness is signalled by the command's own
//! output, and deadlines are generous.

#![allow(clippy::result_large_err)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use sandbox_engine::{BackgroundServer, IsolationMode, IsolationPreference, Server};
use sandbox_host::types::*;
use sandbox_host::{CancelToken, Guard, HostOptions, NetworkTransport, Policy, ProviderInstance};
use serde_json::json;

const KEY: &str = "torture-key";

use test_support::components::createos as component;
use test_support::procs::survivors;
use test_support::RequestExt;

struct Local {
    server: BackgroundServer,
    ctx: EnvironmentContext,
}

impl Local {
    fn start(pref: IsolationPreference) -> Local {
        let server =
            BackgroundServer::start(Server::builder().api_key(KEY).isolation(pref).quiet(true))
                .expect("server starts");
        let ctx = EnvironmentContext {
            driver_key: "createos".into(),
            company_id: "company".into(),
            environment_id: "env-torture".into(),
            issue_id: None,
            config: json!({
                "apiUrl": server.base_url(),
                "timeoutMs": 120_000,
                "requestTimeoutMs": 30_000,
            })
            .to_string(),
        };
        Local { server, ctx }
    }

    fn instance(&self, options: HostOptions) -> ProviderInstance {
        let policy = Policy::for_origin(&self.server.base_url())
            .unwrap()
            .with_secret_header("X-Api-Key", KEY)
            .unwrap();
        let guard = Guard::new(policy, Arc::new(NetworkTransport::new()));
        component()
            .instantiate(options.with_transport(Arc::new(guard)))
            .unwrap()
    }

    fn acquire(&self) -> Lease {
        let request = test_support::acquire("torture");
        self.instance(HostOptions::new())
            .acquire_lease(&self.ctx, &request)
            .unwrap()
            .expect("lease acquired")
    }

    /// Runs `script` under bash; as soon as it prints `ready`, counts the
    /// tagged processes and cancels. The outcome must be `cancelled`, which
    /// the component returns only after the tree was proven terminated.
    /// Returns how many tagged processes were alive at `ready`.
    fn cancel_when_ready(&self, lease: &Lease, tag: &str, script: &str) -> usize {
        let token = CancelToken::new();
        let seen = Arc::new(AtomicUsize::new(0));
        let sink = {
            let (token, seen, tag) = (token.clone(), seen.clone(), tag.to_string());
            Arc::new(move |_: OutputStream, chunk: &[u8]| {
                if chunk.windows(5).any(|w| w == b"ready") && !token.is_cancelled() {
                    seen.store(survivors(&tag).len(), Ordering::SeqCst);
                    token.cancel();
                }
            })
        };
        let mut instance = self.instance(
            HostOptions::new()
                .with_cancel(token.clone())
                .with_output_sink(sink),
        );
        let outcome = instance
            .execute(&self.ctx, lease, &bash(script, 120_000))
            .expect("no trap");
        assert!(
            matches!(outcome, Err(ProviderError::Cancelled(_))),
            "{tag}: expected a confirmed cancellation, got {outcome:?}"
        );
        assert!(token.is_cancelled(), "{tag}: the command never got ready");
        seen.load(Ordering::SeqCst)
    }

    fn run(&self, lease: &Lease, script: &str, timeout_ms: u64) -> ExecuteResult {
        self.instance(HostOptions::new())
            .execute(&self.ctx, lease, &bash(script, timeout_ms))
            .expect("no trap")
            .expect("a confirmed result")
    }
}

fn bash(script: &str, timeout_ms: u64) -> ExecuteRequest {
    test_support::bash(script).timeout_ms(timeout_ms)
}

fn assert_no_survivor(tag: &str, what: &str) {
    let left = survivors(tag);
    assert!(
        left.is_empty(),
        "{what}: processes survived a confirmed cleanup:\n{}",
        left.join("\n")
    );
}

/// Waits (in the command) until `n` tagged `sleep`s run, then says ready.
fn ready_when(tag: &str, n: usize) -> String {
    format!(
        "for _ in $(seq 600); do [ \"$(pgrep -c -f '^(/bin/)?sleep {tag}')\" -ge {n} ] && break; sleep 0.1; done; echo ready"
    )
}

fn torture(pref: IsolationPreference, base: u32) {
    let local = Local::start(pref);
    let bwrap = *local.server.isolation() == IsolationMode::Bwrap;
    let lease = local.acquire();

    // A fork bomb bounded by depth (2^6 - 1 shells, each with a sleep) and
    // by a process limit (effective for non-root users; root ignores
    // RLIMIT_NPROC): every shell answers SIGTERM by forking two more.
    let tag = format!("{base}1");
    let bomb = format!(
        "ulimit -u 4096 2>/dev/null
         b() {{ trap 'sleep {tag} & sleep {tag} &' TERM
               if [ \"$1\" -gt 0 ]; then b $(( $1 - 1 )) & b $(( $1 - 1 )) & fi
               sleep {tag}; sleep {tag}; }}
         b 5 &
         {}; wait",
        ready_when(&tag, 63)
    );
    let seen = local.cancel_when_ready(&lease, &tag, &bomb);
    assert!(seen >= 63, "the bomb was not built: {seen} processes");
    assert_no_survivor(&tag, "fork bomb");

    // A three-level tree where every process ignores SIGTERM.
    let tag = format!("{base}2");
    let stubborn = format!(
        "trap '' TERM
         for i in 1 2 3; do
           ( trap '' TERM; for j in 1 2 3; do ( trap '' TERM; sleep {tag}; : ) & done; sleep {tag}; : ) &
         done
         {}; sleep {tag}; :",
        ready_when(&tag, 12)
    );
    let seen = local.cancel_when_ready(&lease, &tag, &stubborn);
    assert!(seen >= 12, "the tree was not built: {seen} processes");
    assert_no_survivor(&tag, "SIGTERM-ignoring tree");

    // Double forks into new sessions, reparented away from the command; in
    // bwrap mode one also clears its environment (the process-group
    // fallback cannot find such a process, as its docs state).
    let tag = format!("{base}3");
    let escape = if bwrap {
        format!("( env -i /usr/bin/setsid /bin/sleep {tag} & );")
    } else {
        String::new()
    };
    let daemons = format!(
        "( setsid bash -c 'trap \"\" TERM; sleep {tag}; :' & )
         ( setsid sh -c '( sleep {tag} & ); sleep {tag}' & )
         {escape}
         {}; sleep {tag}; :",
        ready_when(&tag, if bwrap { 4 } else { 3 })
    );
    let seen = local.cancel_when_ready(&lease, &tag, &daemons);
    assert!(
        seen >= if bwrap { 5 } else { 4 },
        "the daemons did not start: {seen} processes"
    );
    assert_no_survivor(&tag, "setsid double forks");

    // Closes stdout and stderr and keeps running, ignoring SIGTERM: the
    // stream ends without an exit frame; the deadline and DELETE end it.
    let tag = format!("{base}4");
    let result = local.run(
        &lease,
        &format!("echo ready; exec >&- 2>&-; trap '' TERM; sleep {tag}; :"),
        3_000,
    );
    assert!(result.timed_out, "{result:?}");
    assert_eq!(
        result.stdout, "ready\n",
        "the output before the close is kept"
    );
    assert_no_survivor(&tag, "closed stdout");

    // Closing stdout is not an exit: the real exit status still arrives.
    let tag = format!("{base}5");
    let result = local.run(
        &lease,
        &format!("echo before; exec >&- 2>&-; sleep 1; true {tag}; exit 5"),
        60_000,
    );
    assert_eq!(
        (result.exit_code, result.timed_out, result.stdout.as_str()),
        (Some(5), false, "before\n"),
        "{result:?}"
    );
    let receipt = local
        .instance(HostOptions::new())
        .destroy_lease(&local.ctx, &lease)
        .unwrap()
        .expect("destroyed");
    assert_eq!(receipt.action, TerminationAction::Deleted);
    let report = local.server.shutdown();
    assert!(report.all_exited(), "{report:?}");
    for n in 1..=5 {
        assert_no_survivor(&format!("{base}{n}"), "after shutdown");
    }
}

#[test]
fn torture_bwrap_or_auto() {
    torture(IsolationPreference::Auto, 7310);
}

#[test]
fn torture_process_group() {
    torture(IsolationPreference::ProcessGroup, 7320);
}
