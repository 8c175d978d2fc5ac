//! What coding agents run starts in a sandbox (issue 44 items 1 and 3),
//! through `sandbox run` with both real provider components on the
//! embedded engine:
//!
//! - runtimes that *reserve* far more address space than they use start:
//!   Node's built-in `fetch` (it instantiates a WebAssembly HTTP parser), a
//!   `WebAssembly.Memory` of 4 GiB maximum, a JVM with a 16 GiB heap
//!   ceiling, a 16 GiB `PROT_NONE` mapping. A sandbox limits the memory it
//!   *uses* (its memory cgroup), never what it reserves;
//! - the sandbox's root owns a whole range of ids, as in the service's VM:
//!   `chown` to any id up to 65535 and `tar -xf` of an archive owned by
//!   another user keep the owner;
//! - agent CLIs installed from the npm registry (`@google/gemini-cli`,
//!   `@anthropic-ai/claude-code`, under [`AGENT_CLIS`], which `.ci/run`
//!   installs) print their versions.

use std::path::PathBuf;
use std::process::Output;

mod common;

/// Where `.ci/run` installs the agent CLIs from the npm registry
/// (`npm install --prefix`): under `/opt`, which every sandbox sees
/// read-only.
const AGENT_CLIS: &str = "/opt/sandbox-agents";

/// Both components ./build.sh builds.
fn providers() -> [PathBuf; 2] {
    let createos = common::built_provider();
    let daytona = createos.with_file_name("daytona_provider.wasm");
    assert!(daytona.is_file(), "./build.sh builds both providers");
    [createos, daytona]
}

/// `sandbox run -- sh -c SCRIPT` with `provider`.
fn run(provider: &std::path::Path, script: &str) -> Output {
    common::sandbox_cli(provider, "cli-agent-runtimes")
        .args(["run", "--", "sh", "-c", script])
        .output()
        .expect("running sandbox")
}

/// Runs `script` on both providers and checks that it exits 0 and prints
/// `expected` on stdout.
fn prints_on_both(what: &str, script: &str, expected: &str) {
    for provider in providers() {
        let name = provider.file_name().unwrap().to_string_lossy().to_string();
        let out = run(&provider, script);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && stdout.contains(expected),
            "{name}: {what}: exit {:?}, expected {expected:?} on stdout\n\
             stdout: {stdout}\nstderr: {stderr}",
            out.status.code()
        );
    }
}

#[test]
fn node_fetch_reaches_a_server_in_the_same_sandbox() {
    // The server and the client share the sandbox's loopback.
    let script = r#"node -e '
        const http = require("http");
        const s = http.createServer((q, r) => r.end("fetched-ok"));
        s.listen(0, "127.0.0.1", async () => {
            const r = await fetch("http://127.0.0.1:" + s.address().port + "/");
            console.log(await r.text());
            s.close();
        });'"#;
    prints_on_both("node fetch", script, "fetched-ok");
}

#[test]
fn a_webassembly_memory_of_4_gib_maximum_is_created() {
    let script = r#"node -e '
        const m = new WebAssembly.Memory({ initial: 1, maximum: 65536 });
        m.grow(15);
        console.log("wasm-memory-ok", m.buffer.byteLength);'"#;
    prints_on_both("WebAssembly.Memory", script, "wasm-memory-ok 1048576");
}

#[test]
fn a_16_gib_prot_none_mapping_is_made() {
    let script = "python3 -c 'import mmap; m = mmap.mmap(-1, 16 << 30, \
                  flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, prot=0); \
                  print(\"reserved\", len(m))'";
    prints_on_both("16 GiB PROT_NONE mmap", script, "reserved 17179869184");
}

#[test]
fn a_jvm_with_a_16_gib_heap_ceiling_starts() {
    if !std::path::Path::new("/usr/bin/java").exists() {
        test_support::skipped("no JVM at /usr/bin/java (apt-get install default-jre-headless)");
        return;
    }
    // `-version` goes to stderr; the heap is reserved at start.
    prints_on_both(
        "java -Xmx16g",
        "java -Xmx16g -XX:+UseSerialGC -version 2>&1 && echo jvm-started",
        "jvm-started",
    );
}

#[test]
fn root_gives_files_to_other_ids() {
    prints_on_both(
        "chown",
        "touch /tmp/owned && chown 65000:65001 /tmp/owned && stat -c 'owner %u:%g' /tmp/owned",
        "owner 65000:65001",
    );
}

#[test]
fn tar_as_root_keeps_the_archives_owner() {
    // An archive whose file belongs to uid 1001 (as one made by another
    // user), extracted by root: tar gives the file to 1001.
    let script = "mkdir -p /tmp/src /tmp/dst && echo data > /tmp/src/f \
                  && tar --owner=1001 --group=1001 -C /tmp/src -cf /tmp/a.tar f \
                  && tar -xf /tmp/a.tar -C /tmp/dst && stat -c 'owner %u:%g' /tmp/dst/f";
    prints_on_both("tar -xf as root", script, "owner 1001:1001");
}

#[test]
fn agent_clis_from_npm_print_their_versions() {
    let bin = PathBuf::from(AGENT_CLIS).join("node_modules/.bin");
    let clis = ["gemini", "claude"];
    if clis.iter().any(|cli| !bin.join(cli).exists()) {
        test_support::skipped(&format!(
            "the agent CLIs are not installed: npm install --prefix {AGENT_CLIS} \
             @google/gemini-cli @anthropic-ai/claude-code"
        ));
        return;
    }
    for cli in clis {
        // The CLIs look for a home directory and a terminal; neither is
        // needed to print a version.
        let script = format!(
            "{}/{cli} --version && echo {cli}-version-printed",
            bin.display()
        );
        prints_on_both(cli, &script, &format!("{cli}-version-printed"));
    }
}
