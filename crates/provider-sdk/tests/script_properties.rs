//! Property test: the script built from any command path, arguments, env
//! values and cwd (any characters but NUL) makes a real bash run exactly
//! that command with exactly those strings.
//!
//! The sandbox runs `/bin/bash -lc`; `-l` only sources the login profile
//! first (slow on some machines), which cannot change how the script's
//! quoting parses, so the test runs `/bin/bash -c`.

use proptest::prelude::*;
use provider_sdk::script;
use provider_sdk::types::ExecuteRequest;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::Command;

/// Any string without NUL, biased towards shell metacharacters.
fn hostile() -> impl Strategy<Value = String> {
    let pieces = prop_oneof![
        Just("'".to_string()),
        Just("\"".to_string()),
        Just("\\".to_string()),
        Just("$(id)".to_string()),
        Just("`id`".to_string()),
        Just("${HOME}".to_string()),
        Just("\n".to_string()),
        Just(" ".to_string()),
        Just(";|&<>*?~!#=-".to_string()),
        Just("€".to_string()),
        "[^\u{0}]{0,6}",
    ];
    prop::collection::vec(pieces, 0..6).prop_map(|parts| parts.concat())
}

/// A file or directory name: no NUL, no `/`, not `.` or `..`.
fn name() -> impl Strategy<Value = String> {
    hostile()
        .prop_map(|s| s.replace('/', "_"))
        .prop_filter("a usable name", |s| {
            !s.is_empty() && s != "." && s != ".." && s.len() < 200
        })
}

fn scratch() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("createos-script-props-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn bash_receives_exactly_the_requested_strings(
        program in name(),
        args in prop::collection::vec(hostile(), 0..5),
        value in hostile(),
        cwd in name(),
        stdin in prop::collection::vec(any::<u8>(), 0..64),
        with_env in any::<bool>(),
    ) {
        let root = scratch();
        let bin = root.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        // A program with the generated name that prints its argv, one env
        // var, its cwd and its stdin, NUL-separated.
        let path = bin.join(&program);
        std::fs::write(&path, "#!/bin/sh\nprintf '%s\\0' \"$@\" \"$PROP_VALUE\" \"$PWD\"\ncat\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        let dir = root.join(&cwd);
        std::fs::create_dir_all(&dir).unwrap();
        let stdin_file = root.join("stdin");
        std::fs::write(&stdin_file, &stdin).unwrap();

        let request = ExecuteRequest {
            command: path.to_string_lossy().into_owned(),
            args: args.clone(),
            cwd: Some(dir.to_string_lossy().into_owned()),
            // Without variables the script takes another form (`exec --`).
            env: if with_env { vec![("PROP_VALUE".into(), value.clone())] } else { Vec::new() },
            stdin: Some(stdin.clone()),
            timeout_ms: None,
            result_chars: None,
        };
        prop_assert!(script::validate(&request).is_ok());
        let script = script::build(&request, Some(&stdin_file.to_string_lossy()));
        let out = Command::new("/bin/bash").arg("-c").arg(&script).env_remove("PROP_VALUE").output().unwrap();
        prop_assert!(out.status.success(), "bash failed: {}", String::from_utf8_lossy(&out.stderr));

        let mut expected = Vec::new();
        let value = if with_env { value } else { String::new() };
        for s in args.iter().chain([&value, &dir.to_string_lossy().into_owned()]) {
            expected.extend_from_slice(s.as_bytes());
            expected.push(0);
        }
        expected.extend_from_slice(&stdin);
        prop_assert_eq!(out.stdout, expected);
        std::fs::remove_file(&path).ok();
    }
}
