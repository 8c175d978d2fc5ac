//! The `sandbox` CLI's commands for contract 0.7.0's environment policy,
//! through the contract fixtures (no service: the fixtures answer from
//! what the host sent): `lease acquire --egress/--image/--adapter/
//! --template`, `lease egress`, `lease port`, `template
//! create|list|delete`, and `describe`'s list of what a provider supports.
//! A 0.6.0 component is refused each of them, in words, before anything
//! is created.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod common;

/// The fixture's API origin (it makes no request).
const API: &str = "https://api.example.test";

fn fixture(name: &str) -> PathBuf {
    common::build_fixture(name)
}

fn sandbox(provider: &Path, tag: &str) -> Command {
    let mut command = common::sandbox_cli(provider, tag);
    command.args(["--api-url", API]);
    command
}

fn run(mut command: Command, args: &[&str]) -> Output {
    command.args(args).output().expect("running sandbox")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Fails the test unless `output` succeeded; returns its stdout.
fn ok(output: &Output) -> String {
    assert!(
        output.status.success(),
        "status {:?}\nstdout: {}\nstderr: {}",
        output.status,
        stdout(output),
        stderr(output)
    );
    stdout(output)
}

/// No Rust Debug names in a message for people.
fn for_people(text: &str) {
    for debug in [
        "Unsupported(",
        "InvalidRequest(",
        "Some(",
        "None",
        "ProviderError",
    ] {
        assert!(!text.contains(debug), "{text}");
    }
}

#[test]
fn a_current_provider_takes_the_policy_ports_and_templates_from_the_cli() {
    let provider = fixture("contract-v0-7");
    let tag = "cli-policy-0-7";
    let cli = |args: &[&str]| run(sandbox(&provider, tag), args);

    let described = ok(&cli(&["describe"]));
    assert!(
        described.contains(
            "environment policy: egress-policy yes, images yes, templates yes, idle-pause yes, \
             ports yes, concurrent-sync yes"
        ),
        "{described}"
    );

    let lease = ok(&cli(&[
        "lease",
        "acquire",
        "--egress",
        "127.0.0.1:9",
        "--egress",
        "10.0.0.0/8,*.example.test",
        "--adapter",
        "claude_local",
        "--image",
        "node:22",
    ]))
    .trim()
    .to_owned();
    // The fixture's lease metadata is what the host sent it.
    let listed = ok(&cli(&["lease", "list", "--json"]));
    assert!(listed.contains(&lease), "{listed}");

    let changed = ok(&cli(&["lease", "egress", &lease, "--egress", "none"]));
    assert!(
        changed.contains("egress now no outbound connection"),
        "{changed}"
    );
    let missing = cli(&["lease", "egress", &lease]);
    assert_eq!(missing.status.code(), Some(125));
    assert!(stderr(&missing).contains("give the lease's new policy with --egress"));
    let mixed = cli(&["lease", "egress", &lease, "--egress", "none,a.test"]);
    assert_eq!(mixed.status.code(), Some(125));
    assert!(stderr(&mixed).contains("--egress none blocks every destination"));

    let port = cli(&["lease", "port", &lease, "8000"]);
    let printed = ok(&port);
    assert!(
        printed.contains("url: http://8000.sandbox.test/"),
        "{printed}"
    );
    assert!(
        printed.contains("header: x-sandbox-port-token: token-8000"),
        "{printed}"
    );
    assert!(stderr(&port).contains("their values are secrets"));
    let port_json = ok(&cli(&["lease", "port", &lease, "8000", "--json"]));
    let value: serde_json::Value = serde_json::from_str(&port_json).unwrap();
    assert_eq!(value["url"], "http://8000.sandbox.test/");
    assert_eq!(value["headers"][0]["name"], "x-sandbox-port-token");
    let zero = cli(&["lease", "port", &lease, "0"]);
    assert_eq!(zero.status.code(), Some(2));
    assert!(
        stderr(&zero).contains("0 is not in 1..=65535"),
        "{}",
        stderr(&zero)
    );

    let bad_name = cli(&["template", "create", &lease, "no spaces"]);
    assert_eq!(bad_name.status.code(), Some(125));
    assert!(
        stderr(&bad_name).contains("invalid request"),
        "{}",
        stderr(&bad_name)
    );
    for_people(&stderr(&bad_name));

    let created = cli(&["template", "create", &lease, "after-setup"]);
    let reference = ok(&created).trim().to_owned();
    assert_eq!(reference, "tpl/local/default/after-setup");
    // Captured, then released: the fixture answers idle-pause.
    assert!(
        stderr(&created).contains("left running until idle, then paused"),
        "{}",
        stderr(&created)
    );
    let leases = ok(&cli(&["lease", "list"]));
    assert!(leases.contains("released"), "{leases}");

    let templates = ok(&cli(&["template", "list"]));
    assert!(
        templates.contains("base  tpl/local/default/base"),
        "{templates}"
    );
    let deleted = ok(&cli(&["template", "delete", &reference]));
    assert!(deleted.contains("deleted"), "{deleted}");
    let foreign = cli(&["template", "delete", "tpl/other/default/base"]);
    assert_eq!(foreign.status.code(), Some(125));
    assert!(
        stderr(&foreign).contains("belongs to another company or environment"),
        "{}",
        stderr(&foreign)
    );

    let from_template = ok(&cli(&[
        "lease",
        "acquire",
        "--template",
        "tpl/local/default/base",
    ]));
    assert!(
        from_template.trim().starts_with("lease-"),
        "{from_template}"
    );
    let both = cli(&[
        "lease",
        "acquire",
        "--template",
        "tpl/local/default/base",
        "--image",
        "x",
    ]);
    assert_eq!(both.status.code(), Some(2));
}

#[test]
fn a_0_6_provider_is_refused_the_policy_in_words_before_anything_is_made() {
    let provider = fixture("contract-v0-6");
    let tag = "cli-policy-0-6";
    let cli = |args: &[&str]| run(sandbox(&provider, tag), args);

    let described = ok(&cli(&["describe"]));
    assert!(
        described.contains(
            "environment policy: egress-policy no, images no, templates no, idle-pause no, \
             ports no, concurrent-sync no"
        ),
        "{described}"
    );

    let refused = cli(&["lease", "acquire", "--egress", "a.test"]);
    assert_eq!(refused.status.code(), Some(125));
    let why = stderr(&refused);
    assert!(
        why.contains("does not claim the capability `egress-policy`"),
        "{why}"
    );
    for_people(&why);
    assert!(ok(&cli(&["lease", "list"])).contains("no leases"));

    for (args, capability) in [
        (&["lease", "acquire", "--image", "node:22"][..], "images"),
        (&["lease", "acquire", "--template", "t"][..], "templates"),
        (&["template", "list"][..], "templates"),
        (&["template", "delete", "t"][..], "templates"),
    ] {
        let refused = cli(args);
        assert_eq!(refused.status.code(), Some(125), "{args:?}");
        let why = stderr(&refused);
        assert!(
            why.contains(&format!("does not claim the capability `{capability}`")),
            "{args:?}: {why}"
        );
        for_people(&why);
    }
    assert!(ok(&cli(&["lease", "list"])).contains("no leases"));

    // What it can carry: `*` (the service's default) and an adapter type.
    let lease = ok(&cli(&[
        "lease",
        "acquire",
        "--egress",
        "*",
        "--adapter",
        "x",
    ]))
    .trim()
    .to_owned();
    for (args, capability) in [
        (
            vec!["lease", "egress", &lease, "--egress", "none"],
            "egress-policy",
        ),
        (vec!["lease", "port", &lease, "8000"], "ports"),
        (vec!["template", "create", &lease, "t"], "templates"),
    ] {
        let refused = cli(&args);
        assert_eq!(refused.status.code(), Some(125), "{args:?}");
        let why = stderr(&refused);
        assert!(
            why.contains(&format!("does not claim the capability `{capability}`")),
            "{args:?}: {why}"
        );
    }
    // Refusals leave the lease active.
    let leases = ok(&cli(&["lease", "list"]));
    assert!(leases.contains(&format!("{lease}  active")), "{leases}");
}
