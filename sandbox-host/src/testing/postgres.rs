//! A throwaway PostgreSQL cluster for tests and benchmarks of the
//! PostgreSQL lease store: created with `initdb` in a temp dir, started
//! with `pg_ctl` on a free loopback port (as the user `nobody` when the
//! process runs as root, since PostgreSQL refuses to run as root), stopped
//! and removed on drop.
//!
//! PostgreSQL must be installed (Debian: `apt-get install postgresql`,
//! which puts `initdb` and `pg_ctl` in `/usr/lib/postgresql/<version>/bin`;
//! elsewhere set `PG_BIN` to the directory holding them). When no cluster
//! can be started, [`ThrowawayPostgres::start`] panics with what failed:
//! a test against PostgreSQL fails, it never skips.

use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A PostgreSQL cluster in a temp dir, reachable at [`url`](Self::url)
/// (user `postgres`, trust authentication, database `postgres`), stopped
/// (immediate shutdown) and removed on drop.
pub struct ThrowawayPostgres {
    dir: PathBuf,
    bin: PathBuf,
    port: u16,
    /// The uid and gid the server runs as, when this process is root.
    user: Option<(u32, u32)>,
    /// Whether the server flushes its writes to disk (`fsync`).
    durable: bool,
}

impl ThrowawayPostgres {
    /// Creates and starts a cluster in `<temp>/sandbox-pg-<pid>-<name>`
    /// (`name` tells clusters of one process apart) and waits until it
    /// accepts connections. The server does not flush its writes to disk
    /// (`fsync` off: quick, and nothing of a test cluster must outlive a
    /// crash of the machine).
    ///
    /// # Panics
    /// When PostgreSQL is not installed or the cluster cannot be created
    /// or started; the message names the failing command and holds the
    /// server log.
    pub fn start(name: &str) -> ThrowawayPostgres {
        Self::create(name, false)
    }

    /// [`start`](Self::start) with `fsync` on, as a production server
    /// runs (and as the SQLite store always writes): for benchmarks.
    ///
    /// # Panics
    /// As [`start`](Self::start).
    pub fn start_durable(name: &str) -> ThrowawayPostgres {
        Self::create(name, true)
    }

    fn create(name: &str, durable: bool) -> ThrowawayPostgres {
        let bin = postgres_bin();
        let dir = std::env::temp_dir().join(format!("sandbox-pg-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("creating {} for PostgreSQL: {e}", dir.display()));
        let running_as_root = std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0);
        let user = running_as_root.then(unprivileged_user);
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid))
                .unwrap_or_else(|e| panic!("handing {} to nobody: {e}", dir.display()));
        }
        let cluster = ThrowawayPostgres {
            dir,
            bin,
            port: free_port(),
            user,
            durable,
        };
        let data = cluster.data_dir();
        cluster.run(
            "initdb",
            &[
                "-D",
                path_str(&data),
                "-U",
                "postgres",
                "-A",
                "trust",
                "--no-sync",
                "--no-locale",
                "-E",
                "UTF8",
            ],
        );
        cluster.start_again();
        cluster
    }

    /// The cluster's data directory.
    pub fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// The server log (for a failing test's message).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }

    /// The port the server listens on (127.0.0.1 only).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The store URL of the cluster's `postgres` database, as
    /// `--store`/`SANDBOX_STORE` and [`open_store`](crate::open_store) take it.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Starts the server (after [`stop`](Self::stop)) and waits until it
    /// accepts connections.
    ///
    /// # Panics
    /// When `pg_ctl start` fails (within 60 s).
    pub fn start_again(&self) {
        let mut options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1",
            self.port,
            self.dir.display()
        );
        if !self.durable {
            options.push_str(" -F");
        }
        let (data, log) = (self.data_dir(), self.dir.join("server.log"));
        self.run(
            "pg_ctl",
            &[
                "-D",
                path_str(&data),
                "-l",
                path_str(&log),
                "-o",
                &options,
                "-w",
                "-t",
                "60",
                "start",
            ],
        );
    }

    /// Stops the server (fast shutdown: open connections are closed) and
    /// waits until it is down; the data stays for [`start_again`](Self::start_again).
    ///
    /// # Panics
    /// When `pg_ctl stop` fails.
    pub fn stop(&self) {
        let data = self.data_dir();
        self.run(
            "pg_ctl",
            &["-D", path_str(&data), "-m", "fast", "-w", "stop"],
        );
    }

    /// A `pg_ctl`/`initdb` command run as the cluster's user.
    fn command(&self, program: &str) -> Command {
        let mut command = Command::new(self.bin.join(program));
        command.env("LC_ALL", "C").current_dir(&self.dir);
        if let Some((uid, gid)) = self.user {
            command.uid(uid).gid(gid);
        }
        command
    }

    fn run(&self, program: &str, args: &[&str]) {
        let output = self
            .command(program)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("running {program} from {}: {e}", self.bin.display()));
        if !output.status.success() {
            panic!(
                "PostgreSQL could not be started or stopped: `{program} {}` failed: {}{}\nserver log:\n{}",
                args.join(" "),
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr),
                self.log(),
            );
        }
    }
}

impl Drop for ThrowawayPostgres {
    fn drop(&mut self) {
        let data = self.data_dir();
        let _ = self
            .command("pg_ctl")
            .args(["-D", path_str(&data), "-m", "immediate", "-w", "stop"])
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("temp paths are UTF-8")
}

/// A port no listener holds right now (the kernel's pick).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .expect("binding a loopback port")
}

/// `PG_BIN`, else the newest `/usr/lib/postgresql/<version>/bin` (Debian).
fn postgres_bin() -> PathBuf {
    if let Some(dir) = std::env::var_os("PG_BIN") {
        return PathBuf::from(dir);
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").is_file().then_some((version, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, bin)| bin).unwrap_or_else(|| {
        panic!(
            "PostgreSQL is not installed (no /usr/lib/postgresql/<version>/bin/initdb): \
             `apt-get install -y postgresql`, or set PG_BIN to the directory holding initdb and pg_ctl"
        )
    })
}

/// `nobody`'s uid and gid: PostgreSQL refuses to run as root.
fn unprivileged_user() -> (u32, u32) {
    let id = |flag: &str| -> u32 {
        let output = Command::new("id")
            .args([flag, "nobody"])
            .output()
            .expect("running `id`");
        String::from_utf8_lossy(&output.stdout)
            .trim()
            .parse()
            .expect("the user nobody exists (PostgreSQL must not run as root)")
    };
    (id("-u"), id("-g"))
}
