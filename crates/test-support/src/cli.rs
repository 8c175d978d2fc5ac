//! The `sandbox` CLI as a test runs it: a data directory of its own, no
//! `CREATEOS_API_KEY` from the test's environment and no stdin inherited
//! from the test runner. [`sandbox_cli!`](crate::sandbox_cli) names the
//! binary Cargo built for the calling test.

use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

/// A `sandbox` CLI invocation template: each [`SandboxCli::command`] starts
/// from it.
#[derive(Clone, Debug)]
pub struct SandboxCli {
    bin: PathBuf,
    data: PathBuf,
    provider: Option<PathBuf>,
    api: Option<(String, PathBuf)>,
    envs: Vec<(OsString, OsString)>,
}

/// The `sandbox` binary of the calling crate's tests (only
/// `sandbox-host`'s tests have one), as a [`SandboxCli`] whose data
/// directory is named by `tag` and this process.
#[macro_export]
macro_rules! sandbox_cli {
    ($tag:expr) => {
        $crate::cli::SandboxCli::new(env!("CARGO_BIN_EXE_sandbox"), $tag)
    };
}

impl SandboxCli {
    /// The CLI at `bin`, its data directory `<tmp>/<tag>-<pid>`.
    pub fn new(bin: impl Into<PathBuf>, tag: &str) -> SandboxCli {
        SandboxCli {
            bin: bin.into(),
            data: std::env::temp_dir().join(format!("{tag}-{}", std::process::id())),
            provider: None,
            api: None,
            envs: Vec::new(),
        }
    }

    /// Its data directory (`SANDBOX_DATA_DIR`).
    pub fn data_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.data = dir.into();
        self
    }

    /// The data directory it uses.
    pub fn data(&self) -> &Path {
        &self.data
    }

    /// The provider component (`SANDBOX_PROVIDER`).
    pub fn provider(mut self, wasm: impl Into<PathBuf>) -> Self {
        self.provider = Some(wasm.into());
        self
    }

    /// The API it reaches (`--api-url`) with the key in `key_file`
    /// (`--api-key-file`), given before each command's own arguments.
    pub fn api(mut self, url: impl Into<String>, key_file: impl Into<PathBuf>) -> Self {
        self.api = Some((url.into(), key_file.into()));
        self
    }

    /// One more environment variable for every command.
    pub fn env(mut self, name: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.envs.push((name.into(), value.into()));
        self
    }

    /// More environment variables for every command (as `sandbox engine`
    /// prints them, for example).
    pub fn envs(mut self, vars: &[(String, String)]) -> Self {
        self.envs
            .extend(vars.iter().map(|(k, v)| (k.into(), v.into())));
        self
    }

    /// The CLI with `args`, ready to run (more may be added).
    pub fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(&self.bin);
        command
            .env("SANDBOX_DATA_DIR", &self.data)
            .env_remove("CREATEOS_API_KEY")
            .env_remove("SANDBOX_PROVIDER")
            // A piped stdin is read and given to the command: tests that
            // want one set it; none inherits the test runner's.
            .stdin(Stdio::null())
            .envs(self.envs.iter().map(|(k, v)| (k, v)));
        if let Some(provider) = &self.provider {
            command.env("SANDBOX_PROVIDER", provider);
        }
        if let Some((url, key_file)) = &self.api {
            command
                .arg("--api-url")
                .arg(url)
                .arg("--api-key-file")
                .arg(key_file);
        }
        command.args(args);
        command
    }

    /// Runs the CLI with `args` to its end.
    pub fn output(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("running sandbox")
    }

    /// `lease acquire`, which must succeed: the new lease's id.
    pub fn acquire(&self) -> String {
        let acquired = self.output(&["lease", "acquire"]);
        assert!(acquired.status.success(), "{acquired:?}");
        String::from_utf8(acquired.stdout)
            .unwrap()
            .trim()
            .to_owned()
    }

    /// Every lease `lease list --json` shows, which must succeed.
    pub fn leases(&self) -> Vec<serde_json::Value> {
        let output = self.output(&["lease", "list", "--json"]);
        assert!(output.status.success(), "{output:?}");
        let leases: serde_json::Value =
            serde_json::from_slice(&output.stdout).expect("`lease list --json` prints JSON");
        leases.as_array().expect("a list of leases").clone()
    }

    /// The state of lease `id` as `lease list --json` shows it; panics
    /// when the lease is not listed.
    pub fn lease_state(&self, id: &str) -> String {
        let leases = self.leases();
        leases
            .iter()
            .find(|l| l["id"] == id)
            .map(|l| l["state"].as_str().expect("a lease's state").to_owned())
            .unwrap_or_else(|| {
                panic!(
                    "the CLI of {} does not list lease {id}: {leases:?}",
                    self.data.display()
                )
            })
    }

    /// Starts `lease exec <lease>` of a shell that prints `started` and
    /// becomes `sleep <duration>` (a unique duration finds it in `/proc`);
    /// returns once `started` was read.
    pub fn exec_sleeper(&self, lease: &str, duration: &str) -> Child {
        let mut child = self
            .command(&[
                "lease",
                "exec",
                lease,
                "--",
                "sh",
                "-c",
                "echo started; exec sleep \"$0\"",
                duration,
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("running sandbox");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line, "started\n");
        child
    }

    /// Starts `sandbox --provider <name> engine` and reads the line it
    /// prints first: the variables that point other CLIs at it, returned
    /// with the running engine (stdout read, stderr as `stderr` says).
    pub fn engine(&self, name: &str, stderr: Stdio) -> (Child, Vec<(String, String)>) {
        self.engine_with(&["--provider", name, "engine"], stderr)
    }

    /// [`engine`](Self::engine) with the whole argument list given (for
    /// example with `--port N`).
    pub fn engine_with(&self, args: &[&str], stderr: Stdio) -> (Child, Vec<(String, String)>) {
        let mut child = self
            .command(args)
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("running sandbox engine");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let exports = line
            .trim()
            .strip_prefix("export ")
            .unwrap_or_else(|| panic!("not an export line: {line:?}"))
            .split_whitespace()
            .map(|pair| {
                let (k, v) = pair.split_once('=').unwrap();
                (k.to_owned(), v.to_owned())
            })
            .collect();
        (child, exports)
    }
}

/// A fresh folder `<tmp>/<name>-<pid>` holding the API key in `key`;
/// returns the folder.
pub fn key_dir(name: &str, key: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("key"), key).unwrap();
    dir
}
