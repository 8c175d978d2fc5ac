//! `sandbox engine` after one that died: the leases of the dead engine
//! are cleared by the next engine on the same data directory (it takes the
//! same port and proves the dead engine's sandboxes gone), and an engine
//! that cannot prove a sandbox gone never calls it gone. Real binaries,
//! real engine, real processes. Skipped (with a note) until ./build.sh
//! has built the providers.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

mod common;

/// Both components ./build.sh builds: (createos, daytona).
fn providers() -> (PathBuf, PathBuf) {
    let createos = common::built_provider();
    let daytona = createos.with_file_name("daytona_provider.wasm");
    assert!(daytona.is_file(), "./build.sh builds both providers");
    (createos, daytona)
}

fn fresh(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// A running `sandbox engine`, stopped with SIGTERM when dropped (a
/// failing test leaves none behind).
struct Serving(Option<Child>);

impl Drop for Serving {
    fn drop(&mut self) {
        if let Some(mut engine) = self.0.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &engine.id().to_string()])
                .status();
            let _ = engine.wait();
        }
    }
}

/// Stops an engine with SIGTERM; its exit status and stderr.
fn stop(mut engine: Serving) -> (Option<i32>, String) {
    let engine = engine.0.take().unwrap();
    let killed = Command::new("kill")
        .args(["-TERM", &engine.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let output = engine.wait_with_output().unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The port of the API URL in the config file an engine wrote.
fn api_port(exports: &[(String, String)]) -> u16 {
    let config = &exports
        .iter()
        .find(|(k, _)| k == "SANDBOX_CONFIG")
        .expect("SANDBOX_CONFIG exported")
        .1;
    let text = std::fs::read_to_string(config).unwrap();
    let config: serde_json::Value = serde_json::from_str(&text).unwrap();
    let url = config["apiUrl"].as_str().unwrap();
    let authority = url.split("://").nth(1).unwrap().split('/').next().unwrap();
    authority.rsplit(':').next().unwrap().parse().unwrap()
}

fn cli(data: &Path, exports: &[(String, String)]) -> test_support::cli::SandboxCli {
    test_support::sandbox_cli!("cli-engine-restart")
        .data_dir(data)
        .envs(exports)
}

/// Before: after `kill -9` of `sandbox engine`, its leases could never be
/// cleared: a new engine took another port, `lease release` and `lease
/// destroy` got "connection refused" forever. Now the next engine on the
/// data directory serves on the same port, proves the dead engine's
/// sandboxes gone (the guard ended them), and the release clears the
/// lease, with both providers.
#[test]
fn a_lease_of_an_engine_that_died_is_cleared_by_the_next_engine_on_its_data_directory() {
    let (createos, daytona) = providers();
    for (provider, name) in [(&createos, "createos"), (&daytona, "daytona")] {
        let data = fresh(&format!("cli-engine-restart-{name}"));
        let (mut engine, exports) = test_support::sandbox_cli!("cli-engine-restart")
            .data_dir(&data)
            .provider(provider)
            .engine(name, Stdio::null());
        let cli = cli(&data, &exports);
        let lease = cli.acquire();
        let ran = cli.output(&["lease", "exec", &lease, "--", "echo", "hi"]);
        assert_eq!(ran.status.code(), Some(0), "{name}: {ran:?}");
        let port = api_port(&exports);
        engine.kill().unwrap();
        engine.wait().unwrap();

        let (again, exports_again) = test_support::sandbox_cli!("cli-engine-restart")
            .data_dir(&data)
            .provider(provider)
            .engine(name, Stdio::piped());
        let again = Serving(Some(again));
        // A command on the old lease is refused with what to do.
        let refused = cli.output(&["lease", "exec", &lease, "--", "echo", "hi"]);
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert_eq!(refused.status.code(), Some(125), "{name}: {stderr}");
        assert!(refused.stdout.is_empty(), "{name}: {refused:?}");
        assert!(
            stderr.contains(&format!("the sandbox of lease {lease} no longer exists"))
                && stderr.contains(&format!("sandbox lease release {lease}")),
            "{name}: {stderr}"
        );
        let released = cli.output(&["lease", "release", &lease]);
        let stderr = String::from_utf8_lossy(&released.stderr);
        assert_eq!(released.status.code(), Some(0), "{name}: {stderr}");
        assert_eq!(exports_again, exports, "{name}: the same files");
        assert_eq!(api_port(&exports_again), port, "{name}: the same port");
        let state = cli.lease_state(&lease);
        assert!(
            state == "released" || state == "destroyed",
            "{name}: the lease is {state}"
        );
        // The new engine serves new leases too.
        let fresh_lease = cli.acquire();
        let ran = cli.output(&["lease", "exec", &fresh_lease, "--", "echo", "again"]);
        assert_eq!(String::from_utf8_lossy(&ran.stdout), "again\n", "{ran:?}");
        assert!(cli
            .output(&["lease", "destroy", &fresh_lease])
            .status
            .success());
        let (code, stderr) = stop(again);
        assert_eq!(code, Some(0), "{name}: {stderr}");
        let _ = std::fs::remove_dir_all(&data);
    }
}

/// The engine's guard (`createos-local-guard`, its child): it ends every
/// sandbox process when the engine dies.
fn guard_of(engine: u32) -> u32 {
    let guards: Vec<u32> = test_support::procs::containing("createos-local-guard")
        .into_iter()
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let after = stat.rfind(')').map_or("", |i| &stat[i + 2..]);
            after.split_whitespace().nth(1) == Some(&engine.to_string())
        })
        .collect();
    assert_eq!(guards.len(), 1, "one guard of engine {engine}: {guards:?}");
    guards[0]
}

/// A sandbox's machine ends with its engine however the engine ends, even
/// when the engine's guard does nothing (here: it is stopped): the
/// machine's bwrap is killed by the kernel when the engine's process dies
/// (its parent-death signal), and the PID namespace with it. The next
/// engine then proves the sandbox gone from its records and the lease is
/// destroyed. (Before machines had that signal, the command ran on until
/// the next engine killed it.)
#[test]
fn a_command_dies_with_its_engine_even_when_the_guard_does_nothing() {
    let (createos, _) = providers();
    let data = fresh("cli-engine-leftover");
    let (mut engine, exports) = test_support::sandbox_cli!("cli-engine-leftover")
        .data_dir(&data)
        .provider(&createos)
        .engine("createos", Stdio::null());
    let cli = cli(&data, &exports);
    let lease = cli.acquire();
    let duration = format!("{}.25", 1000 + std::process::id() % 1000);
    let mut exec = cli.exec_sleeper(&lease, &duration);
    assert!(
        test_support::eventually(std::time::Duration::from_secs(10), || {
            test_support::procs::exact(&["sleep", &duration]).len() == 1
        }),
        "the command runs"
    );
    let guard = guard_of(engine.id());
    assert!(Command::new("kill")
        .args(["-STOP", &guard.to_string()])
        .status()
        .unwrap()
        .success());
    engine.kill().unwrap();
    engine.wait().unwrap();
    let _ = exec.wait();
    let gone = test_support::eventually(std::time::Duration::from_secs(5), || {
        test_support::procs::exact(&["sleep", &duration]).is_empty()
    });
    let left = test_support::procs::exact(&["sleep", &duration]);
    let _ = Command::new("kill")
        .args(["-CONT", &guard.to_string()])
        .status();
    assert!(
        gone,
        "the command outlived its engine, whose guard was stopped: {left:?}"
    );

    let (again, _) = test_support::sandbox_cli!("cli-engine-leftover")
        .data_dir(&data)
        .provider(&createos)
        .engine("createos", Stdio::piped());
    let again = Serving(Some(again));
    let destroyed = cli.output(&["lease", "destroy", &lease]);
    let stderr = String::from_utf8_lossy(&destroyed.stderr);
    assert_eq!(destroyed.status.code(), Some(0), "{stderr}");
    assert_eq!(cli.lease_state(&lease), "destroyed");
    let (code, stderr) = stop(again);
    assert_eq!(code, Some(0), "{stderr}");
    let _ = std::fs::remove_dir_all(&data);
}

/// Before: an engine started with the `--port` of a dead one answered 404
/// ("already gone") for a sandbox id it never knew, and the provider took
/// that as proof: the dead engine's lease was cleared without proof. Now
/// an engine on another data directory refuses the lease's key (401), and
/// one on the same data directory whose state cannot vouch for the id (the
/// dead engine kept no records there) answers that it cannot call it gone:
/// the lease is not cleared.
#[test]
fn an_engine_on_a_dead_ones_port_without_its_records_does_not_call_its_sandboxes_gone() {
    let (createos, _) = providers();
    let data = fresh("cli-engine-norecords");
    let other = fresh("cli-engine-norecords-other");
    let (mut engine, exports) = test_support::sandbox_cli!("cli-engine-norecords")
        .data_dir(&data)
        .provider(&createos)
        .engine("createos", Stdio::null());
    let cli = cli(&data, &exports);
    let lease = cli.acquire();
    let port = api_port(&exports);
    engine.kill().unwrap();
    engine.wait().unwrap();

    // An engine on the dead engine's port, serving `dir`.
    let port_arg = port.to_string();
    let engine_on = |dir: &Path, stderr: Stdio| {
        Serving(Some(
            test_support::sandbox_cli!("cli-engine-norecords")
                .data_dir(dir)
                .provider(&createos)
                .engine_with(
                    &["--provider", "createos", "engine", "--port", &port_arg],
                    stderr,
                )
                .0,
        ))
    };
    // Another data directory, the dead engine's port: another key.
    let elsewhere = engine_on(&other, Stdio::null());
    let destroyed = cli.output(&["lease", "destroy", &lease]);
    assert_ne!(destroyed.status.code(), Some(0), "{destroyed:?}");
    assert_ne!(cli.lease_state(&lease), "destroyed");
    let (code, stderr) = stop(elsewhere);
    assert_eq!(code, Some(0), "{stderr}");

    // The same data directory and port, as if the dead engine had kept no
    // records.
    let _ = std::fs::remove_dir_all(data.join("engine/state"));
    let again = engine_on(&data, Stdio::piped());
    let destroyed = cli.output(&["lease", "destroy", &lease]);
    let stderr = String::from_utf8_lossy(&destroyed.stderr);
    assert_eq!(destroyed.status.code(), Some(120), "{stderr}");
    assert!(stderr.contains("was not confirmed"), "{stderr}");
    assert_eq!(cli.lease_state(&lease), "poisoned");
    let (code, stderr) = stop(again);
    assert_eq!(code, Some(0), "{stderr}");
    let _ = std::fs::remove_dir_all(&data);
    let _ = std::fs::remove_dir_all(&other);
}

/// When the dead engine's port is taken, the next engine serves on another
/// port and says that the old leases cannot reach it and stay poisoned.
#[test]
fn an_engine_whose_predecessors_port_is_taken_says_what_that_means_for_its_leases() {
    let (createos, _) = providers();
    let data = fresh("cli-engine-taken");
    let (mut engine, exports) = test_support::sandbox_cli!("cli-engine-taken")
        .data_dir(&data)
        .provider(&createos)
        .engine("createos", Stdio::null());
    let port = api_port(&exports);
    engine.kill().unwrap();
    engine.wait().unwrap();
    let holder = std::net::TcpListener::bind(("127.0.0.1", port)).expect("the freed port");

    let again = Serving(Some(
        test_support::sandbox_cli!("cli-engine-taken")
            .data_dir(&data)
            .provider(&createos)
            .engine_with(&["--provider", "createos", "engine"], Stdio::piped())
            .0,
    ));
    // The config file (the same path) now names the new engine.
    assert_ne!(api_port(&exports), port, "served on the taken port");
    let (code, stderr) = stop(again);
    drop(holder);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "port {port}, where the engine before this one served, is taken"
        )),
        "{stderr}"
    );
    assert!(stderr.contains("stay poisoned"), "{stderr}");
    let _ = std::fs::remove_dir_all(&data);
}

/// A script that reads the engine's export line and stops it at once
/// (`sandbox engine > env & … kill %1`) gets an orderly stop: the signal
/// handlers exist before the line is printed. Before, a SIGTERM right
/// after the line killed the engine unstopped (no exit status): seen in
/// CI under load (`an_engine_whose_predecessors_port_is_taken…`); here
/// the window is hit only when the machine is loaded.
#[test]
fn an_engine_signalled_right_after_its_export_line_stops_in_order() {
    let (createos, _) = providers();
    for round in 0..5 {
        let data = fresh(&format!("cli-engine-quick-stop-{round}"));
        let (engine, _) = test_support::sandbox_cli!("cli-engine-quick-stop")
            .data_dir(&data)
            .provider(&createos)
            .engine("createos", Stdio::piped());
        let (code, stderr) = stop(Serving(Some(engine)));
        assert_eq!(code, Some(0), "round {round}: {stderr}");
        assert!(stderr.contains("the engine stopped"), "{stderr}");
        let _ = std::fs::remove_dir_all(&data);
    }
}
