//! Issue 24 (items 2, 3, 4, 5) and issue 25: what a sandbox's own
//! commands and the API's fields can do to the host through the launch
//! path, proven with real bubblewrap and real processes.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{marker, Harness, KEY};
use createos_local::{IsolationMode, IsolationPreference, Server};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

/// A harness that insists on bubblewrap (these tests are about it).
async fn confined(builder: createos_local::ServerBuilder) -> Harness {
    let h = Harness::start_builder(builder.isolation(IsolationPreference::RequireBwrap)).await;
    assert_eq!(*h.server.isolation(), IsolationMode::Bwrap);
    h
}

/// A shared library whose constructor creates `escaped` (an absolute host
/// path) when it is loaded, compiled with the host's `cc` into a fresh
/// host directory. `None` when there is no C compiler.
fn evil_library(m: &str, escaped: &std::path::Path) -> Option<std::path::PathBuf> {
    let dir = std::path::PathBuf::from(format!("/tmp/{m}-lib"));
    std::fs::create_dir_all(&dir).expect("lib dir");
    let src = dir.join("evil.c");
    std::fs::write(
        &src,
        format!(
            "#include <fcntl.h>\n#include <unistd.h>\n\
             __attribute__((constructor)) static void escape(void) {{\n\
               int fd = open(\"{}\", O_CREAT | O_WRONLY, 0666);\n\
               if (fd >= 0) close(fd);\n\
             }}\n",
            escaped.display()
        ),
    )
    .expect("write source");
    let lib = dir.join("evil.so");
    let built = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&src)
        .status()
        .ok()?;
    if !built.success() {
        return None;
    }
    use std::os::unix::fs::PermissionsExt;
    for p in [&dir, &lib] {
        let mode = if p.is_dir() { 0o755 } else { 0o644 };
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod");
    }
    // The library works: loaded by a host program it creates the file.
    let _ = Command::new("/bin/true")
        .env("LD_PRELOAD", &lib)
        .status()
        .expect("run true");
    assert!(
        escaped.exists(),
        "the test library does not run its constructor"
    );
    std::fs::remove_file(escaped).expect("reset");
    Some(lib)
}

/// Issue 24 item 2: the env given at sandbox creation and at process
/// creation is the command's, set inside the namespaces; it never becomes
/// the environment of the host-side launcher. An `LD_PRELOAD` naming a
/// host library that creates a host file when loaded must not run on the
/// host (it did: bwrap's outer process loaded it before any namespace
/// existed). CreateOS face: sandbox env and process override.
#[tokio::test]
async fn sandbox_env_never_reaches_the_host_side_launcher() {
    let m = marker("preload");
    let escaped = std::path::PathBuf::from(format!("/tmp/{m}-escaped"));
    let Some(lib) = evil_library(&m, &escaped) else {
        eprintln!("no C compiler: skipped");
        return;
    };
    let lib = lib.display().to_string();
    let h = confined(Server::builder()).await;
    // Sandbox-level env.
    let sb = h
        .sandbox_with_env(json!({ "LD_PRELOAD": lib, "GCONV_PATH": "/tmp", "SEEN": "yes" }))
        .await;
    let r = h.exec(&sb, "echo $SEEN $LD_PRELOAD").await;
    assert_eq!(
        r["stdout"],
        format!("yes {lib}\n"),
        "env reaches the command: {r}"
    );
    h.spawn(&sb, "sleep 0.2").await;
    // Per-process override of a declared key.
    let other = h.sandbox_with_env(json!({ "LD_PRELOAD": "" })).await;
    let (st, v) = h
        .post(
            &format!("/v1/sandboxes/{other}/exec"),
            json!({"cmd": "/bin/sh", "args": ["-c", "echo $LD_PRELOAD"], "env": {"LD_PRELOAD": lib}}),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["data"]["result"]["stdout"], format!("{lib}\n"), "{v}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let escaped_now = escaped.exists();
    let _ = std::fs::remove_file(&escaped);
    assert!(!escaped_now, "a sandbox's LD_PRELOAD ran code on the host");
    assert!(h.server.shutdown().await.all_exited());
    let _ = std::fs::remove_dir_all(format!("/tmp/{m}-lib"));
}

/// Issue 24 item 2, Daytona face: the env given at create reaches session
/// commands and `process/execute`, never the host-side launcher.
#[tokio::test]
async fn daytona_env_never_reaches_the_host_side_launcher() {
    let m = marker("dpreload");
    let escaped = std::path::PathBuf::from(format!("/tmp/{m}-escaped"));
    let Some(lib) = evil_library(&m, &escaped) else {
        eprintln!("no C compiler: skipped");
        return;
    };
    let lib = lib.display().to_string();
    let h = confined(Server::builder().toolbox_port(0)).await;
    let api = h.server.daytona_api_url();
    let toolbox = h.server.toolbox_url().to_string();
    let call = |method: Method, url: String, body: Value| {
        let http = h.http.clone();
        async move {
            let resp = http
                .request(method, url)
                .header("Authorization", format!("Bearer {KEY}"))
                .json(&body)
                .send()
                .await
                .expect("request");
            let st = resp.status();
            (st, resp.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let (st, v) = call(
        Method::POST,
        format!("{api}/sandbox"),
        json!({"snapshot": "daytona-small", "env": {"LD_PRELOAD": lib, "SEEN": "yes"},
               "autoStopInterval": 0}),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let sb = v["id"].as_str().expect("id").to_string();
    let (st, v) = call(
        Method::POST,
        format!("{toolbox}/{sb}/process/execute"),
        json!({"command": "sh -c 'echo $SEEN $LD_PRELOAD'"}),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let out = v["result"].as_str().unwrap_or_default();
    assert!(out.ends_with(&format!("yes {lib}\n")), "{v}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let escaped_now = escaped.exists();
    let _ = std::fs::remove_file(&escaped);
    assert!(!escaped_now, "a sandbox's LD_PRELOAD ran code on the host");
    assert!(h.server.shutdown().await.all_exited());
    let _ = std::fs::remove_dir_all(format!("/tmp/{m}-lib"));
}

/// Waits until `f` holds (generous bound); panics with `what` otherwise.
pub async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !f() {
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
