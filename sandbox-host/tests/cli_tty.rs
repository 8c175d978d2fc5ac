//! `sandbox run -t` and `-i` (issue 38 item 4) through the real binary on
//! both providers against the embedded engine. For `-t` the test is the
//! user's terminal: it opens a pseudo-terminal, makes it the CLI's
//! controlling terminal (so the kernel sends the CLI `SIGWINCH` when the
//! test resizes it), types keys on its master side and reads what the CLI
//! shows there. Needs `./build.sh`.

use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustix::termios::{self, Winsize};

mod common;

/// A bound against a hang, not a measure of speed.
const PATIENCE: Duration = Duration::from_secs(90);

const CREATEOS: &str = "createos_provider.wasm";
const DAYTONA: &str = "daytona_provider.wasm";

fn built(file: &str) -> PathBuf {
    let wasm = common::workspace_dir()
        .join("target/wasm32-wasip2/release")
        .join(file);
    assert!(
        wasm.is_file(),
        "{} is not built: run ./build.sh first",
        wasm.display()
    );
    wasm
}

/// The user's terminal: a pseudo-terminal whose slave side is the CLI's
/// stdin, stdout and stderr and its controlling terminal.
struct Terminal {
    master: std::fs::File,
    /// Kept open by the test, so the terminal's mode can be read after
    /// the CLI exited.
    slave: std::fs::File,
    shown: Arc<Mutex<Vec<u8>>>,
}

impl Terminal {
    fn open(columns: u16, rows: u16) -> Terminal {
        use rustix::pty::{grantpt, openpt, ptsname, unlockpt, OpenptFlags};
        let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY).unwrap();
        grantpt(&master).unwrap();
        unlockpt(&master).unwrap();
        let name = ptsname(&master, Vec::new()).unwrap();
        let slave = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(name.to_str().unwrap())
            .unwrap();
        let terminal = Terminal {
            master: std::fs::File::from(master),
            slave,
            shown: Arc::default(),
        };
        terminal.resize(columns, rows);
        let mut reader = terminal.master.try_clone().unwrap();
        let shown = terminal.shown.clone();
        std::thread::spawn(move || {
            let mut buffer = [0u8; 4096];
            // Ends when the test's slave side closes with the terminal.
            while let Ok(read @ 1..) = reader.read(&mut buffer) {
                shown.lock().unwrap().extend_from_slice(&buffer[..read]);
            }
        });
        terminal
    }

    fn resize(&self, columns: u16, rows: u16) {
        let size = Winsize {
            ws_row: rows,
            ws_col: columns,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        termios::tcsetwinsize(self.master.as_fd(), size).unwrap();
    }

    /// Starts `sandbox run` with `args` on this terminal, as a shell would
    /// start it in the foreground.
    fn run(&self, provider: &str, tag: &str, args: &[&str]) -> Child {
        let mut command = common::sandbox_cli(&built(provider), tag);
        command.arg("run").args(args);
        self.start(command)
    }

    /// Starts `command` on this terminal in the foreground.
    fn start(&self, mut command: std::process::Command) -> Child {
        command
            .stdin(Stdio::from(self.slave.try_clone().unwrap()))
            .stdout(Stdio::from(self.slave.try_clone().unwrap()))
            .stderr(Stdio::from(self.slave.try_clone().unwrap()));
        // SAFETY: only async-signal-safe system calls between fork and exec.
        unsafe {
            command.pre_exec(|| {
                rustix::process::setsid()?;
                rustix::process::ioctl_tiocsctty(rustix::stdio::stdin())?;
                Ok(())
            });
        }
        command.spawn().expect("starting sandbox")
    }

    fn type_keys(&self, keys: &[u8]) {
        (&self.master).write_all(keys).unwrap();
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.shown.lock().unwrap()).into_owned()
    }

    /// Waits until the terminal shows `needle` after its first `from`
    /// bytes; the length shown then.
    fn wait_for(&self, from: usize, needle: &str) -> usize {
        let start = Instant::now();
        loop {
            let shown = self.shown.lock().unwrap().clone();
            let after = String::from_utf8_lossy(&shown[from.min(shown.len())..]).into_owned();
            if after.contains(needle) {
                return shown.len();
            }
            assert!(
                start.elapsed() < PATIENCE,
                "expected {needle:?} on the terminal, it shows {:?}",
                self.text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The terminal's modes, as a shell would find them.
    fn modes(
        &self,
    ) -> (
        termios::InputModes,
        termios::OutputModes,
        termios::LocalModes,
    ) {
        let mode = termios::tcgetattr(self.slave.as_fd()).unwrap();
        (mode.input_modes, mode.output_modes, mode.local_modes)
    }
}

fn wait(child: &mut Child, terminal: &Terminal) -> ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if start.elapsed() > PATIENCE {
            let _ = child.kill();
            panic!(
                "sandbox did not end; the terminal shows {:?}",
                terminal.text()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `stty size` answers this terminal's size, `tty` names a `/dev/pts/N`;
/// after the test resizes this terminal, `stty size` answers the new size
/// where the provider claims `terminal-resize` (Daytona); CreateOS's
/// service has no resize, so the CLI says the size stays, and it does.
/// The terminal's mode is the same after the CLI as before it.
fn size_tty_and_resize(provider: &str, tag: &str, resizes: bool) {
    let terminal = Terminal::open(100, 30);
    let before = terminal.modes();
    let mut cli = terminal.run(
        provider,
        tag,
        &[
            "-t",
            "--",
            "sh",
            "-c",
            "tty; stty size; read line; stty size",
        ],
    );
    let seen = terminal.wait_for(0, "30 100");
    assert!(terminal.text().contains("/dev/pts/"), "{}", terminal.text());
    // Raw mode while the command runs: no echo here, no line editing.
    let raw = terminal.modes();
    assert!(!raw
        .2
        .contains(termios::LocalModes::ICANON | termios::LocalModes::ECHO));
    terminal.resize(120, 40);
    // The window change and the key below reach the CLI by two paths (a
    // signal, stdin), as in any terminal: the key comes a while later so
    // that the command reads its size after the resize.
    std::thread::sleep(Duration::from_millis(500));
    terminal.type_keys(b"\r");
    let status = wait(&mut cli, &terminal);
    let text = terminal.text();
    assert_eq!(status.code(), Some(0), "{text}");
    let after = String::from_utf8_lossy(&terminal.shown.lock().unwrap()[seen..]).into_owned();
    if resizes {
        assert!(after.contains("40 120"), "{text}");
    } else {
        assert!(after.contains("30 100"), "{text}");
        assert!(text.contains("cannot resize a terminal"), "{text}");
    }
    assert!(text.contains("/dev/pts/"), "{text}");
    assert!(
        terminal.modes() == before,
        "the terminal's mode was not restored"
    );
}

#[test]
fn createos_terminal_has_the_size_asked_and_a_pts() {
    size_tty_and_resize(CREATEOS, "cli-tty-size-createos", false);
}

#[test]
fn daytona_terminal_has_the_size_asked_and_follows_a_resize() {
    size_tty_and_resize(DAYTONA, "cli-tty-size-daytona", true);
}

/// A Python REPL reads two lines typed half a second apart and answers
/// both; `exit()` ends it with status 0.
fn python_repl(provider: &str, tag: &str) {
    let terminal = Terminal::open(80, 24);
    let mut cli = terminal.run(
        provider,
        tag,
        &[
            "-t",
            "-e",
            "PYTHON_BASIC_REPL=1",
            "--",
            "python3",
            "-q",
            "-i",
        ],
    );
    let seen = terminal.wait_for(0, ">>> ");
    terminal.type_keys(b"print(6 * 7)\r");
    let seen = terminal.wait_for(seen, "42");
    std::thread::sleep(Duration::from_millis(500));
    terminal.type_keys(b"print('a' + 'b')\r");
    terminal.wait_for(seen, "ab");
    terminal.type_keys(b"exit()\r");
    let status = wait(&mut cli, &terminal);
    assert_eq!(status.code(), Some(0), "{}", terminal.text());
}

/// `^C` typed here is the byte 3 in raw mode: the sandbox's terminal
/// turns it into SIGINT for `sleep`, which ends (130, as a shell says);
/// the terminal's mode is restored.
fn ctrl_c(provider: &str, tag: &str) {
    let terminal = Terminal::open(80, 24);
    let before = terminal.modes();
    let mut cli = terminal.run(
        provider,
        tag,
        &["-t", "--", "sh", "-c", "echo sleeping-now; exec sleep 600"],
    );
    terminal.wait_for(0, "sleeping-now");
    std::thread::sleep(Duration::from_millis(300));
    terminal.type_keys(b"\x03");
    let status = wait(&mut cli, &terminal);
    assert_eq!(status.code(), Some(130), "{}", terminal.text());
    // The command ended by itself: no cleanup after a cancel.
    assert!(
        !terminal.text().contains("cancelled"),
        "{}",
        terminal.text()
    );
    assert!(
        terminal.modes() == before,
        "the terminal's mode was not restored"
    );
}

/// `-i` passes stdin on as it comes (as `docker exec -i`): the command
/// answers a line before stdin is closed, then the next, and ends at the
/// input's end.
fn live_stdin(provider: &str, tag: &str) {
    let mut cli = common::sandbox_cli(&built(provider), tag)
        .args([
            "run",
            "-i",
            "--",
            "sh",
            "-c",
            "read a; echo \"got $a\"; read b; echo \"got $b\"; cat",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = cli.stdin.take().unwrap();
    let mut stdout = cli.stdout.take().unwrap();
    let shown: Arc<Mutex<Vec<u8>>> = Arc::default();
    let reader = {
        let shown = shown.clone();
        std::thread::spawn(move || {
            let mut buffer = [0u8; 4096];
            while let Ok(read @ 1..) = stdout.read(&mut buffer) {
                shown.lock().unwrap().extend_from_slice(&buffer[..read]);
            }
        })
    };
    let text = || String::from_utf8_lossy(&shown.lock().unwrap()).into_owned();
    let until = |needle: &str| {
        let start = Instant::now();
        while !text().contains(needle) {
            assert!(start.elapsed() < PATIENCE, "no {needle:?} in {:?}", text());
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    stdin.write_all(b"hello\n").unwrap();
    // Seen while stdin is still open.
    until("got hello");
    stdin.write_all(b"world\nlast line\n").unwrap();
    until("got world");
    drop(stdin);
    let status = cli.wait().unwrap();
    reader.join().unwrap();
    let mut stderr = String::new();
    cli.stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert_eq!(text(), "got hello\ngot world\nlast line\n", "{stderr}");
}

/// Keys cross as bytes: a UTF-8 character typed in two writes half a
/// second apart reaches the command whole, and a 1 MB paste (into a
/// terminal the command put in raw mode) arrives byte for byte.
fn split_character_and_huge_paste(provider: &str, tag: &str) {
    let terminal = Terminal::open(80, 24);
    let script = "stty raw -echo; echo raw-now; head -c 3 | od -An -tx1; \
                  head -c 1000000 | cksum; stty sane";
    let mut cli = terminal.run(provider, tag, &["-t", "--", "sh", "-c", script]);
    terminal.wait_for(0, "raw-now");
    let euro = "€".as_bytes();
    terminal.type_keys(&euro[..1]);
    std::thread::sleep(Duration::from_millis(500));
    terminal.type_keys(&euro[1..]);
    let seen = terminal.wait_for(0, "e2 82 ac");
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    let paste: Vec<u8> = (0..1_000_000)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 32) as u8
        })
        .collect();
    let expected = {
        let mut cksum = std::process::Command::new("cksum")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        cksum.stdin.take().unwrap().write_all(&paste).unwrap();
        let out = cksum.wait_with_output().unwrap();
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    };
    let writer = {
        let master = terminal.master.try_clone().unwrap();
        std::thread::spawn(move || (&master).write_all(&paste).unwrap())
    };
    terminal.wait_for(seen, &expected);
    writer.join().unwrap();
    let status = wait(&mut cli, &terminal);
    assert_eq!(status.code(), Some(0), "{}", terminal.text());
}

/// `sandbox lease exec -t LEASE -- bash` is a usable shell: a prompt, a
/// command typed and answered, `tty`, `exit`; the lease stays usable.
fn lease_shell(name: &str) {
    let data = std::env::temp_dir().join(format!("cli-tty-lease-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data);
    let (mut engine, exports) = test_support::sandbox_cli!("cli-tty-lease")
        .data_dir(&data)
        .engine(name, Stdio::null());
    let cli = test_support::sandbox_cli!("cli-tty-lease")
        .data_dir(&data)
        .envs(&exports);
    let lease = cli.acquire();
    let terminal = Terminal::open(90, 20);
    let mut shell = terminal.start(cli.command(&[
        "lease",
        "exec",
        "-t",
        "-e",
        "PS1=shell> ",
        &lease,
        "--",
        "bash",
        "--norc",
        "-i",
    ]));
    let seen = terminal.wait_for(0, "shell> ");
    terminal.type_keys(b"echo $((6 * 7)); tty; stty size\r");
    let seen = terminal.wait_for(seen, "20 90");
    terminal.type_keys(b"exit 3\r");
    let status = wait(&mut shell, &terminal);
    let text = terminal.text();
    assert_eq!(status.code(), Some(3), "{name}: {text}");
    let after = String::from_utf8_lossy(&terminal.shown.lock().unwrap()[..seen]).into_owned();
    assert!(
        after.contains("42") && after.contains("/dev/pts/"),
        "{name}: {text}"
    );
    let again = cli.output(&["lease", "exec", &lease, "--", "echo", "again"]);
    assert_eq!(
        String::from_utf8_lossy(&again.stdout),
        "again\n",
        "{again:?}"
    );
    let released = cli.output(&["lease", "release", &lease]);
    assert!(released.status.success(), "{released:?}");
    // SIGTERM: the engine ends its sandboxes before it exits.
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&engine),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    engine.wait().unwrap();
}

#[test]
fn createos_lease_exec_t_is_a_shell() {
    lease_shell("createos");
}

#[test]
fn daytona_lease_exec_t_is_a_shell() {
    lease_shell("daytona");
}

/// SIGTERM to `sandbox` while a terminal command runs stops it and cleans
/// up (130, as without `-t`), and the terminal's mode is restored.
fn sigterm(provider: &str, tag: &str) {
    let terminal = Terminal::open(80, 24);
    let before = terminal.modes();
    let mut cli = terminal.run(
        provider,
        tag,
        &["-t", "--", "sh", "-c", "echo sleeping-now; exec sleep 600"],
    );
    terminal.wait_for(0, "sleeping-now");
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&cli),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    let status = wait(&mut cli, &terminal);
    let text = terminal.text();
    assert_eq!(status.code(), Some(130), "{text}");
    assert!(text.contains("cancelled"), "{text}");
    assert!(
        terminal.modes() == before,
        "the terminal's mode was not restored"
    );
}

/// `sandbox describe` says what each provider's interactive processes can
/// do: both give terminals and pipes; only Daytona resizes a terminal.
#[test]
fn describe_names_each_providers_interactive_capabilities() {
    for (provider, resize) in [(CREATEOS, false), (DAYTONA, true)] {
        let output = common::sandbox_cli(&built(provider), "cli-tty-describe")
            .args(["describe", "--json"])
            .output()
            .unwrap();
        assert!(output.status.success(), "{output:?}");
        let value: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        let named = |name: &str| {
            value["capabilities"]
                .as_array()
                .unwrap()
                .iter()
                .any(|c| c == name)
        };
        assert!(named("login-pty") && named("duplex-channels"), "{value}");
        assert_eq!(named("terminal-resize"), resize, "{provider}: {value}");
    }
}

/// Each check of this file run once per provider, as its own test: the
/// check's function and short tag (its runs' data directories are
/// `cli-tty-TAG-createos` and `-daytona`), then the CreateOS test's name
/// and the Daytona one's.
macro_rules! on_both_providers {
    ($($check:ident($tag:literal): $createos:ident, $daytona:ident;)*) => {$(
        #[test]
        fn $createos() {
            $check(CREATEOS, concat!("cli-tty-", $tag, "-createos"));
        }
        #[test]
        fn $daytona() {
            $check(DAYTONA, concat!("cli-tty-", $tag, "-daytona"));
        }
    )*};
}

on_both_providers! {
    python_repl("repl"):
        createos_python_repl_answers_two_lines_typed_apart,
        daytona_python_repl_answers_two_lines_typed_apart;
    ctrl_c("ctrl-c"):
        createos_ctrl_c_ends_a_sleep_in_the_terminal,
        daytona_ctrl_c_ends_a_sleep_in_the_terminal;
    live_stdin("live"):
        createos_dash_i_streams_stdin_live,
        daytona_dash_i_streams_stdin_live;
    split_character_and_huge_paste("bytes"):
        createos_keys_cross_as_bytes_split_or_huge,
        daytona_keys_cross_as_bytes_split_or_huge;
    sigterm("term"):
        createos_sigterm_stops_a_terminal_command_and_restores_the_mode,
        daytona_sigterm_stops_a_terminal_command_and_restores_the_mode;
}
