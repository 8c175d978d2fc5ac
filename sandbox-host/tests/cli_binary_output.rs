//! Output that is not UTF-8 (binary data): contract 0.4.0 carries live
//! output as bytes, so `sandbox run` writes exactly the bytes the command
//! printed, on both streams, with no note. Both providers, the embedded
//! engine. (Before 0.4.0 such bytes arrived replaced by U+FFFD, and the CLI
//! said so; it still does for a component built for an older contract.)

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

mod common;

/// Both components ./build.sh builds.
fn providers() -> [PathBuf; 2] {
    let createos = common::built_provider();
    let daytona = createos.with_file_name("daytona_provider.wasm");
    assert!(daytona.is_file(), "./build.sh builds both providers");
    [createos, daytona]
}

/// `len` deterministic bytes of every value (xorshift), so that invalid
/// UTF-8, NUL bytes and characters cut anywhere all occur.
fn binary(len: usize, mut seed: u64) -> Vec<u8> {
    (0..len)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 24) as u8
        })
        .collect()
}

/// The MD5 of `bytes` as `md5sum` prints it (the same tool the sandbox's
/// command uses).
fn md5(bytes: &[u8]) -> String {
    let mut child = Command::new("md5sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("md5sum runs");
    child.stdin.take().unwrap().write_all(bytes).unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_owned()
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Issue: `sandbox run -- head -c 1000000 /dev/urandom | md5sum` did not
/// match the bytes the command printed (contract 0.3.0 carried text, so
/// bytes that were not UTF-8 became U+FFFD, about 1.8 times as many bytes
/// in all). Now every byte arrives: 1 MB from /dev/urandom (its MD5
/// computed inside the sandbox over the same bytes), 1 MiB given on stdin
/// and printed back on stdout, and 64 KiB on stderr; no U+FFFD note.
#[test]
fn binary_output_arrives_byte_for_byte_on_both_providers() {
    let providers = providers();
    let input = binary(1 << 20, 0x9E37_79B9_7F4A_7C15);
    let file = std::env::temp_dir().join(format!("cli-binary-{}.bin", std::process::id()));
    std::fs::write(&file, &input).unwrap();
    let small = &input[..65_536];
    let small_file = file.with_extension("small");
    std::fs::write(&small_file, small).unwrap();
    for provider in &providers {
        let name = provider.display();
        // Daytona's logs mark each piece of stdout with the bytes 01 01 01
        // and of stderr with 02 02 02, in band: output holding those
        // sequences cannot be told apart (docs/daytona-api.md, "Logs"; about
        // one random megabyte in nine holds one). The random bytes given to
        // Daytona have them broken (01 01 01 -> 01 01 03), every byte value
        // still present.
        let daytona = provider.to_string_lossy().contains("daytona");
        let random = if daytona {
            "head -c 1000000 /dev/urandom | perl -0777 -pe \
             's/\x01\x01\x01/\x01\x01\x03/g; s/\x02\x02\x02/\x02\x02\x03/g' > /tmp/random.bin"
        } else {
            "head -c 1000000 /dev/urandom > /tmp/random.bin"
        };
        // Random bytes, and their MD5 as the sandbox computed it.
        let output = common::sandbox_cli(provider, "cli-binary-output")
            .args([
                "run",
                "--",
                "sh",
                "-c",
                &format!("{random} && cat /tmp/random.bin && md5sum /tmp/random.bin >&2"),
            ])
            .output()
            .expect("running sandbox");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(0), "{name}: {stderr}");
        assert_eq!(output.stdout.len(), 1_000_000, "{name}: {stderr}");
        let sum = md5(&output.stdout);
        assert!(
            stderr.contains(&format!("{sum}  /tmp/random.bin")),
            "{name}: the bytes written (md5 {sum}) are not the bytes printed: {stderr}"
        );
        assert!(!stderr.contains("U+FFFD"), "{name}: {stderr}");

        // Known bytes in, the same bytes out.
        let output = common::sandbox_cli(provider, "cli-binary-output")
            .arg("run")
            .arg("--stdin")
            .arg(&file)
            .args(["--", "cat"])
            .output()
            .expect("running sandbox");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(0), "{name}: {stderr}");
        assert!(
            output.stdout == input,
            "{name}: stdout differs from the {} bytes printed ({} bytes arrived, md5 {} vs {}); \
             {stderr}",
            input.len(),
            output.stdout.len(),
            md5(&output.stdout),
            md5(&input)
        );
        assert!(!stderr.contains("U+FFFD"), "{name}: {stderr}");

        // And on stderr.
        let output = common::sandbox_cli(provider, "cli-binary-output")
            .arg("run")
            .arg("--stdin")
            .arg(&small_file)
            .args(["--", "sh", "-c", "cat >&2"])
            .output()
            .expect("running sandbox");
        assert_eq!(output.status.code(), Some(0), "{name}");
        assert!(
            contains(&output.stderr, small),
            "{name}: stderr lacks the {} bytes printed ({} bytes arrived)",
            small.len(),
            output.stderr.len()
        );
        assert!(output.stdout.is_empty(), "{name}");

        // Text stays text.
        let text = common::sandbox_cli(provider, "cli-binary-output")
            .args(["run", "--", "echo", "héllo"])
            .output()
            .expect("running sandbox");
        let stderr = String::from_utf8_lossy(&text.stderr);
        assert_eq!(text.stdout, "héllo\n".as_bytes(), "{stderr}");
        assert!(!stderr.contains("U+FFFD"), "{name}: {stderr}");
    }
    let _ = std::fs::remove_file(&file);
    let _ = std::fs::remove_file(&small_file);
}
