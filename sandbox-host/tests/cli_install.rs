//! The `sandbox` binary as installed software (issue 39): it carries both
//! provider components inside it, so a copy of the binary alone, run from
//! an empty directory, runs commands on either provider; `--version` names
//! the contract versions it hosts and the components it carries;
//! `sandbox doctor` judges this host; completions and a manual page come
//! from the same command definitions; a `--provider` that is no provider
//! gets a clear message.

use std::path::PathBuf;
use std::process::{Command, Output};

/// A copy of the `sandbox` binary alone, in an empty directory of its own
/// (nothing of the workspace beside it or above the directory it runs in).
fn lone_copy(tag: &str) -> (PathBuf, PathBuf) {
    let dir = std::env::temp_dir().join(format!("cli-install-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let bin_dir = dir.join("bin");
    let empty = dir.join("empty");
    std::fs::create_dir_all(&bin_dir).unwrap();
    std::fs::create_dir_all(&empty).unwrap();
    let bin = bin_dir.join("sandbox");
    std::fs::copy(env!("CARGO_BIN_EXE_sandbox"), &bin).expect("copy the binary");
    (bin, empty)
}

fn run(bin: &PathBuf, cwd: &PathBuf, data: &PathBuf, args: &[&str]) -> Output {
    let mut tries = 0;
    loop {
        let ran = Command::new(bin)
            .current_dir(cwd)
            .env("SANDBOX_DATA_DIR", data)
            .env_remove("SANDBOX_PROVIDER")
            .env_remove("SANDBOX_CONFIG")
            .env_remove("SANDBOX_API_KEY_FILE")
            .args(args)
            .output();
        match ran {
            // The copy was just written: a child another test thread forked
            // meanwhile holds its write descriptor until that child execs
            // (close-on-exec), and the kernel refuses to run a file open
            // for writing.
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && tries < 100 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            ran => return ran.expect("running sandbox"),
        }
    }
}

#[test]
fn a_lone_copy_of_the_binary_runs_commands_on_both_providers() {
    let (bin, empty) = lone_copy("lone");
    let data = empty.with_file_name("data");
    for provider in [None, Some("createos"), Some("daytona")] {
        let mut args = Vec::new();
        if let Some(p) = provider {
            args.extend(["--provider", p]);
        }
        args.extend(["run", "--", "echo", "hello"]);
        let out = run(&bin, &empty, &data, &args);
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "hello\n",
            "{provider:?}: exit {:?}: {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // `describe` says which component it ran.
    let out = run(&bin, &empty, &data, &["--provider", "daytona", "describe"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("component: daytona provider ") && text.contains("built into this binary"),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(empty.parent().unwrap());
}

#[test]
fn version_names_the_contracts_and_the_embedded_components() {
    let (bin, empty) = lone_copy("version");
    let out = run(&bin, &empty, &empty, &["--version"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with(&format!("sandbox {}\n", env!("CARGO_PKG_VERSION"))),
        "{text}"
    );
    let contracts: Vec<&str> = sandbox_host::SERVED_INTERFACES
        .iter()
        .map(|i| i.rsplit_once('@').unwrap().1)
        .collect();
    assert!(
        text.contains(&format!(
            "hosts the sandbox-provider contract {}",
            contracts.join(", ")
        )),
        "{text}"
    );
    for name in ["createos", "daytona"] {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("embedded {name} provider ")))
            .unwrap_or_else(|| panic!("no {name} line: {text}"));
        let digest = line
            .split("(sha256 ")
            .nth(1)
            .and_then(|d| d.strip_suffix(')'))
            .unwrap_or_default();
        assert!(
            digest.len() == 64 && digest.chars().all(|c| c.is_ascii_hexdigit()),
            "{line}"
        );
        // The same digest `describe` shows for the component it runs.
        let describe = run(&bin, &empty, &empty, &["--provider", name, "describe"]);
        assert!(
            String::from_utf8_lossy(&describe.stdout).contains(digest),
            "{name}: describe names another component"
        );
    }
    let _ = std::fs::remove_dir_all(empty.parent().unwrap());
}

#[test]
fn a_provider_that_is_no_provider_is_said_plainly() {
    let (bin, empty) = lone_copy("bad-provider");
    let out = run(
        &bin,
        &empty,
        &empty,
        &["--provider", "nope", "run", "--", "true"],
    );
    assert_eq!(out.status.code(), Some(125));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no provider named nope: this sandbox carries createos and daytona"),
        "{err}"
    );
    let text_file = empty.join("notes.txt");
    std::fs::write(&text_file, "not a component").unwrap();
    let out = run(
        &bin,
        &empty,
        &empty,
        &["--provider", text_file.to_str().unwrap(), "describe"],
    );
    assert_eq!(out.status.code(), Some(125));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("notes.txt"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let _ = std::fs::remove_dir_all(empty.parent().unwrap());
}

#[test]
fn doctor_judges_this_host_and_says_it_as_json_too() {
    let (bin, empty) = lone_copy("doctor");
    let out = run(&bin, &empty, &empty.join("data"), &["doctor", "--json"]);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    let works = report["sandboxRunWorks"].as_bool().expect("a verdict");
    // Its verdict is the truth: `sandbox run` works here exactly when it
    // says so (and the exit status says the same).
    let ran = run(&bin, &empty, &empty.join("data"), &["run", "--", "true"]);
    assert_eq!(works, ran.status.success(), "{report}");
    assert_eq!(out.status.success(), works, "{report}");
    let checks = report["checks"].as_array().expect("rows");
    for name in [
        "provider component",
        "bubblewrap",
        "user namespaces",
        "machine model",
        "memory limit",
        "disk per sandbox",
        "data directory",
        "lease store",
    ] {
        assert!(
            checks.iter().any(|c| c["check"] == name),
            "no {name} row: {report}"
        );
    }
    // A data directory that cannot be written is named, with the fix.
    let blocked = empty.join("a-file");
    std::fs::write(&blocked, "").unwrap();
    let out = run(&bin, &empty, &blocked.join("data"), &["doctor"]);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("data directory") && text.contains("--data-dir"),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(empty.parent().unwrap());
}

#[test]
fn completions_and_the_manual_come_from_the_command_line_definitions() {
    let (bin, empty) = lone_copy("completions");
    for (shell, needle) in [
        ("bash", "_sandbox()"),
        ("zsh", "#compdef sandbox"),
        ("fish", "complete -c sandbox"),
    ] {
        let out = run(&bin, &empty, &empty, &["completions", shell]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains(needle),
            "{shell}: {text}"
        );
        assert!(text.contains("doctor"), "{shell} completes the subcommands");
    }
    let out = run(&bin, &empty, &empty, &["man"]);
    let page = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && page.contains(".TH sandbox 1"),
        "{page}"
    );
    let _ = std::fs::remove_dir_all(empty.parent().unwrap());
}
