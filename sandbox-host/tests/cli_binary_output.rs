//! Output that is not UTF-8: the provider contract carries output as text,
//! so such bytes arrive replaced by U+FFFD. The CLI says so instead of
//! passing altered data off as the command's output; text output gets no
//! note. Both providers, the embedded engine.

use std::path::PathBuf;

mod common;

/// Both components ./build.sh builds, or `None` (with a note).
fn providers() -> Option<[PathBuf; 2]> {
    let createos = common::built_provider()?;
    let daytona = createos.with_file_name("daytona_provider.wasm");
    assert!(daytona.is_file(), "./build.sh builds both providers");
    Some([createos, daytona])
}

/// Before: `sandbox run -- cat` of 64 KiB of random bytes printed about
/// 1.8 times as many bytes (each invalid byte became three) and said
/// nothing.
#[test]
fn binary_output_is_called_out_and_text_is_not() {
    let Some(providers) = providers() else {
        return;
    };
    let binary: Vec<u8> = (0..65_536u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8 | 0x80)
        .collect();
    let file = std::env::temp_dir().join(format!("cli-binary-{}.bin", std::process::id()));
    std::fs::write(&file, &binary).unwrap();
    for provider in &providers {
        let output = common::sandbox_cli(provider, "cli-binary-output")
            .arg("run")
            .arg("--stdin")
            .arg(&file)
            .args(["--", "cat"])
            .output()
            .expect("running sandbox");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(
            output.status.code(),
            Some(0),
            "{}: {stderr}",
            provider.display()
        );
        assert_ne!(output.stdout, binary, "the contract carries text");
        assert!(
            stderr.contains("U+FFFD replacement character")
                && stderr.contains("bytes that were not UTF-8"),
            "{}: {stderr}",
            provider.display()
        );

        let text = common::sandbox_cli(provider, "cli-binary-output")
            .args(["run", "--", "echo", "héllo"])
            .output()
            .expect("running sandbox");
        let stderr = String::from_utf8_lossy(&text.stderr);
        assert_eq!(text.stdout, "héllo\n".as_bytes(), "{stderr}");
        assert!(
            !stderr.contains("U+FFFD"),
            "{}: {stderr}",
            provider.display()
        );
    }
    let _ = std::fs::remove_file(&file);
}
