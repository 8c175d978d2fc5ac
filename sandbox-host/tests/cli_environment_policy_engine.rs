//! Contract 0.7.0's environment policy through the `sandbox` CLI, the
//! real provider components (./build.sh) and the real engine (`sandbox
//! engine`, real processes in sandbox machines), on both providers where
//! the provider claims the part: a lease's `--egress` reaches one server
//! this test starts on the host's loopback and is refused another, and
//! `lease egress` replaces it; `lease port` answers a server started in
//! the sandbox with the printed headers and refuses without them (and
//! without `sandbox engine --ingress`, the CLI says so); `template
//! create|list|delete`, and a lease acquired from the template sees the
//! file. Skipped (with a note) where sandboxes get no machine of their own.

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};

mod common;

/// Both components ./build.sh builds: (createos, daytona).
fn providers() -> (PathBuf, PathBuf) {
    let createos = common::built_provider();
    let daytona = createos.with_file_name("daytona_provider.wasm");
    assert!(daytona.is_file(), "./build.sh builds both providers");
    (createos, daytona)
}

/// Sandbox machines (and so egress and ports) are offered here.
fn machines_here() -> bool {
    if sandbox_engine::machine::enabled_here() {
        return true;
    }
    test_support::skipped("no sandbox machines on this host (user namespaces refused)");
    false
}

/// A server on `address` (a loopback address) answering every request
/// with `hello from ADDRESS:PORT`; its port.
fn host_server(address: &str) -> u16 {
    test_support::http::serve_text(address, |port| format!("hello from {address}:{port}\n"))
}

/// A `sandbox engine` of `provider` (stopped with SIGTERM when dropped)
/// and the CLI pointed at it.
struct Engine {
    child: Child,
    cli: test_support::cli::SandboxCli,
}

impl Engine {
    /// `sandbox --egress EGRESS engine [--ingress]` on a data directory
    /// named by `tag`.
    fn start(provider: &PathBuf, tag: &str, egress: &str, ingress: bool) -> Engine {
        let base = test_support::sandbox_cli!(tag).provider(provider);
        let _ = std::fs::remove_dir_all(base.data());
        let mut args = vec!["--egress", egress, "engine"];
        if ingress {
            args.push("--ingress");
        }
        let (child, exports) = base.engine_with(&args, Stdio::null());
        let cli = test_support::sandbox_cli!(tag)
            .provider(provider)
            .envs(&exports);
        Engine { child, cli }
    }

    fn run(&self, args: &[&str]) -> Output {
        self.cli.output(args)
    }

    /// Runs `args`, which must succeed; its stdout.
    fn ok(&self, args: &[&str]) -> String {
        let output = self.run(args);
        assert!(
            output.status.success(),
            "{args:?}: {:?}\nstdout: {}\nstderr: {}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap()
    }

    /// `lease exec LEASE -- sh -c SCRIPT`, which must succeed; its stdout.
    fn sh(&self, lease: &str, script: &str) -> String {
        self.ok(&["lease", "exec", lease, "--", "sh", "-c", script])
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// What `curl` in the sandbox gets from `url`: the body of a 200 and the
/// status (403 for a destination the sandbox's egress proxy refuses).
fn fetch(url: &str) -> String {
    format!(
        "code=$(curl -s --max-time 10 --noproxy '' -o /tmp/body -w '%{{http_code}}' {url}); \
         if [ \"$code\" = 200 ]; then cat /tmp/body; fi; echo \" $code\""
    )
}

#[test]
fn a_lease_egress_reaches_the_allowed_server_and_is_refused_another_on_both_providers() {
    let (createos, daytona) = providers();
    if !machines_here() {
        return;
    }
    // Two servers on one address (CreateOS filters by port too), one on
    // another address (Daytona filters by address only).
    let first = host_server("127.0.0.1");
    let second = host_server("127.0.0.1");
    let elsewhere = host_server("127.0.0.2");
    let at = |address: &str, port: u16| format!("http://{address}:{port}/");

    // CreateOS: host:port entries.
    let engine = Engine::start(
        &createos,
        "cli-policy-egress-createos",
        "127.0.0.1,127.0.0.2",
        false,
    );
    let lease = engine
        .ok(&[
            "lease",
            "acquire",
            "--egress",
            &format!("127.0.0.1:{first}"),
        ])
        .trim()
        .to_owned();
    let script = format!(
        "{}; {}",
        fetch(&at("127.0.0.1", first)),
        fetch(&at("127.0.0.1", second))
    );
    assert_eq!(
        engine.sh(&lease, &script),
        format!("hello from 127.0.0.1:{first}\n 200\n 403\n")
    );
    let replaced = engine.ok(&[
        "lease",
        "egress",
        &lease,
        "--egress",
        &format!("127.0.0.1:{second}"),
    ]);
    assert!(
        replaced.contains(&format!("only 127.0.0.1:{second}")),
        "{replaced}"
    );
    assert_eq!(
        engine.sh(&lease, &script),
        format!(" 403\nhello from 127.0.0.1:{second}\n 200\n")
    );
    engine.ok(&["lease", "destroy", &lease]);
    drop(engine);

    // Daytona: addresses for every port; an entry with a port is refused,
    // never dropped.
    let engine = Engine::start(
        &daytona,
        "cli-policy-egress-daytona",
        "127.0.0.1,127.0.0.2",
        false,
    );
    let refused = engine.run(&["lease", "acquire", "--egress", "127.0.0.1:80"]);
    assert_eq!(refused.status.code(), Some(125));
    assert!(
        stderr(&refused).contains("names a port"),
        "{}",
        stderr(&refused)
    );
    let lease = engine
        .ok(&["lease", "acquire", "--egress", "127.0.0.1"])
        .trim()
        .to_owned();
    let script = format!(
        "{}; {}",
        fetch(&at("127.0.0.1", first)),
        fetch(&at("127.0.0.2", elsewhere))
    );
    assert_eq!(
        engine.sh(&lease, &script),
        format!("hello from 127.0.0.1:{first}\n 200\n 403\n")
    );
    engine.ok(&["lease", "egress", &lease, "--egress", "127.0.0.2"]);
    assert_eq!(
        engine.sh(&lease, &script),
        format!(" 403\nhello from 127.0.0.2:{elsewhere}\n 200\n")
    );
    engine.ok(&["lease", "destroy", &lease]);
}

/// `lease port` output: the URL and the `NAME: VALUE` header lines.
fn endpoint(printed: &str) -> (String, Vec<String>) {
    let url = printed
        .lines()
        .find_map(|l| l.strip_prefix("url: "))
        .expect("a url line")
        .to_owned();
    let headers = printed
        .lines()
        .filter_map(|l| l.strip_prefix("header: "))
        .map(str::to_owned)
        .collect();
    (url, headers)
}

/// `curl` on this host: the body and the status.
fn curl(url: &str, headers: &[String]) -> String {
    let mut command = Command::new("curl");
    command.args([
        "-s",
        "--max-time",
        "10",
        "--noproxy",
        "*",
        "-w",
        " %{http_code}",
    ]);
    for header in headers {
        command.arg("-H").arg(header);
    }
    let output = command.arg(url).output().expect("curl on the host");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn a_lease_port_answers_with_its_headers_and_refuses_without_on_both_providers() {
    let (createos, daytona) = providers();
    if !machines_here() {
        return;
    }
    for (provider, name) in [(&createos, "createos"), (&daytona, "daytona")] {
        let engine = Engine::start(
            provider,
            &format!("cli-policy-port-{name}"),
            "127.0.0.1",
            true,
        );
        let lease = engine.ok(&["lease", "acquire"]).trim().to_owned();
        engine.sh(
            &lease,
            "mkdir -p /tmp/www && echo served-inside > /tmp/www/index.html && cd /tmp/www && \
             (setsid python3 -m http.server 8000 >/dev/null 2>&1 &) && \
             for i in $(seq 50); do curl -s -o /dev/null --noproxy '*' http://127.0.0.1:8000/ && break; sleep 0.1; done",
        );
        let opened = engine.run(&["lease", "port", &lease, "8000"]);
        assert!(opened.status.success(), "{name}: {}", stderr(&opened));
        assert!(
            stderr(&opened).contains("their values are secrets"),
            "{name}: {}",
            stderr(&opened)
        );
        let (url, headers) = endpoint(&String::from_utf8_lossy(&opened.stdout));
        assert_eq!(headers.len(), 1, "{name}: one token header");
        assert_eq!(curl(&url, &headers), "served-inside\n 200", "{name}");
        let without = curl(&url, &[]);
        assert!(
            without.ends_with(" 401") || without.ends_with(" 403"),
            "{name}: {without}"
        );
        let zero = engine.run(&["lease", "port", &lease, "0"]);
        assert_eq!(zero.status.code(), Some(2), "{name}");
        engine.ok(&["lease", "destroy", &lease]);
        drop(engine);

        // Without --ingress, the refusal says what to do.
        let engine = Engine::start(
            provider,
            &format!("cli-policy-noport-{name}"),
            "127.0.0.1",
            false,
        );
        let lease = engine.ok(&["lease", "acquire"]).trim().to_owned();
        let refused = engine.run(&["lease", "port", &lease, "8000"]);
        assert_eq!(refused.status.code(), Some(125), "{name}");
        let why = stderr(&refused);
        assert!(why.contains("ingress"), "{name}: {why}");
        assert!(refused.stdout.is_empty(), "{name}: no URL, no header");
        engine.ok(&["lease", "destroy", &lease]);
    }
}

#[test]
fn a_template_keeps_a_file_for_the_leases_made_from_it() {
    let (createos, daytona) = providers();
    if !machines_here() {
        return;
    }
    // CreateOS forks a paused sandbox; Daytona snapshots a stopped one.
    for (provider, tag) in [
        (&createos, "cli-policy-template"),
        (&daytona, "cli-policy-template-daytona"),
    ] {
        let engine = Engine::start(provider, tag, "127.0.0.1", false);
        let setup = engine.ok(&["lease", "acquire"]).trim().to_owned();
        engine.sh(&setup, "echo kept-in-template > marker.txt");
        let reference = engine
            .ok(&["template", "create", &setup, "setup-1"])
            .trim()
            .to_owned();
        // The setup lease was released once captured.
        assert_eq!(engine.cli.lease_state(&setup), "released", "{tag}");
        let listed = engine.ok(&["template", "list"]);
        assert!(
            listed.contains(&format!("setup-1  {reference}")),
            "{tag}: {listed}"
        );

        let forked = engine
            .ok(&["lease", "acquire", "--template", &reference])
            .trim()
            .to_owned();
        assert_eq!(
            engine.sh(&forked, "cat marker.txt"),
            "kept-in-template\n",
            "{tag}"
        );
        let deleted = engine.ok(&["template", "delete", &reference]);
        assert!(deleted.contains("deleted"), "{tag}: {deleted}");
        assert_eq!(
            engine.ok(&["template", "list"]).trim(),
            "no templates",
            "{tag}"
        );
        // Deleting the template leaves the lease made from it alone.
        assert_eq!(
            engine.sh(&forked, "cat marker.txt"),
            "kept-in-template\n",
            "{tag}"
        );
        let gone = engine.run(&["lease", "acquire", "--template", &reference]);
        assert_eq!(gone.status.code(), Some(125), "{tag}: {}", stderr(&gone));
        assert!(
            stderr(&gone).contains(&format!(
                "the template {reference} may no longer exist (see `sandbox template list`)"
            )),
            "{tag}: {}",
            stderr(&gone)
        );
        engine.ok(&["lease", "destroy", &forked]);
    }
}
