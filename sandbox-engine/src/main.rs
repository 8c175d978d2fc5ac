//! `createos-local --port 0 --api-key KEY`: serves the CreateOS API (and
//! the Daytona API under `/daytona/api`) on loopback, prints `listening on
//! http://127.0.0.1:<port>` once on stdout, logs to stderr, and on
//! SIGINT/SIGTERM terminates every process tree it started (exit status 1
//! if any survived). With `--toolbox-port P` it also serves the Daytona
//! toolbox on a second loopback origin and prints a second line, `toolbox
//! on http://127.0.0.1:<port>`.

use std::io::Write;
use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use sandbox_engine::{IsolationPreference, Server};

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Isolation {
    /// bwrap if it works here; else refuse to start (unless --allow-unconfined).
    Auto,
    /// bwrap or refuse to start.
    Bwrap,
    /// NO isolation: commands run unconfined as this user on the host.
    ProcessGroup,
}

/// A local CreateOS-compatible sandbox server that runs real processes.
#[derive(Debug, Parser)]
#[command(name = "createos-local", version)]
struct Cli {
    /// Loopback port to listen on (0 = any free port).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// The API key clients must send in X-Api-Key (or as a Bearer token on
    /// the Daytona face). Prefer the environment variable or
    /// --api-key-file: a key given as --api-key is readable by every user of
    /// this host in `/proc/<pid>/cmdline`.
    #[arg(long, env = "CREATEOS_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Read the API key from this file (its first line; the file should be
    /// readable by its owner only).
    #[arg(long, value_name = "FILE", conflicts_with = "api_key")]
    api_key_file: Option<std::path::PathBuf>,
    /// Most sandboxes at once (both faces); one more is answered 429
    /// `sandbox_limit`. The default follows this host: a quarter of the
    /// kernel's pid_max in sandboxes of 2048 tasks each, 16 to 256.
    #[arg(long, value_name = "N", default_value_t = sandbox_engine::trees::budgets::Budgets::for_host().max_sandboxes)]
    max_sandboxes: usize,
    /// Most live processes started through the API across every sandbox,
    /// counting every task they started where each command has a pids
    /// group of its own (root with cgroup v1 pids); one more is answered
    /// 429 `process_limit`. Default: 64 per sandbox allowed, 256 to 1024.
    #[arg(long, value_name = "N", default_value_t = sandbox_engine::trees::budgets::Budgets::for_host().max_processes)]
    max_processes: usize,
    /// Each sandbox's own disk: its root, /tmp included, is a file system
    /// of this size (K, M, G or T; 0 = none), so a sandbox that fills it
    /// gets ENOSPC and the host's disk stays free. Default: the data
    /// directory's free space at start less 1 GiB, shared by
    /// --max-sandboxes, at least 512M and at most 2G. Needs a root server
    /// that can mount loop devices, or an ordinary user with fuse2fs,
    /// fusermount, /dev/fuse and user_allow_other in /etc/fuse.conf (else
    /// logged at start: no disk quota, with the fix). A creation is refused 429 `disk_limit` unless the data
    /// directory's file system could still hold every sandbox disk filled
    /// up plus 1 GiB for the host.
    #[arg(long, value_name = "SIZE", value_parser = sandbox_engine::storage::disk::parse_size)]
    sandbox_disk: Option<u64>,
    /// Most memory each sandbox may use (K, M, G or T), swap included:
    /// past it the kernel kills a process of that sandbox only. Limits
    /// what a sandbox uses, never the address space its programs reserve.
    /// Default: half the host's RAM, at most 8G. Needs a root server with
    /// a cgroup v1 memory hierarchy, or a cgroup v2 group delegated to the
    /// server that offers the memory controller (else logged at start:
    /// not limited).
    #[arg(long, value_name = "SIZE", value_parser = sandbox_engine::storage::disk::parse_size)]
    sandbox_memory: Option<u64>,
    /// A finished process (exited, tree gone) keeps its exit and output
    /// for this many seconds, then answers 404 and its memory is returned.
    #[arg(long, value_name = "SECONDS", default_value_t = sandbox_engine::store_defaults::FINISHED_TTL_SECS)]
    finished_ttl: u64,
    /// At most this many finished processes are kept per sandbox (the most
    /// recently finished); older ones answer 404.
    #[arg(long, value_name = "N", default_value_t = sandbox_engine::store_defaults::FINISHED_KEEP)]
    finished_keep: usize,
    /// How much output all finished processes keep together, engine-wide
    /// (default 64M; K, M, G): past it the output of the oldest finished
    /// processes is evicted first (their exit stays; a replay of it
    /// answers 410 output_offset_expired).
    #[arg(long, value_name = "SIZE", value_parser = parse_output_budget)]
    finished_output: Option<u64>,
    /// Directory for sandbox roots (default: a temporary directory).
    #[arg(long)]
    data_dir: Option<std::path::PathBuf>,
    /// Directory where every sandbox is recorded (default: none). A server
    /// started on the directory of one that died proves that one's
    /// sandboxes gone before it answers (404 only once proven, 500
    /// `unconfirmed` otherwise).
    #[arg(long, value_name = "DIR")]
    state_dir: Option<std::path::PathBuf>,
    /// Isolation mode.
    #[arg(long, value_enum, default_value_t = Isolation::Auto)]
    isolation: Isolation,
    /// Let `--isolation auto` fall back to process groups (NO isolation)
    /// when bubblewrap cannot run here.
    #[arg(long)]
    allow_unconfined: bool,
    /// Answer 429 beyond REQUESTS/WINDOW_MS `/v1` requests in any sliding
    /// window (for example 20/2000), as CreateOS limits a caller. Off by default.
    #[arg(long, value_name = "REQUESTS/WINDOW_MS", value_parser = parse_rate_limit)]
    rate_limit: Option<(u32, std::time::Duration)>,
    /// Serve the Daytona toolbox on a second loopback listener on this port
    /// (0 = any free port), at `/toolbox/{sandboxId}/...`; prints a second
    /// stdout line `toolbox on http://127.0.0.1:<port>`. Without it the
    /// toolbox is served under `/daytona/toolbox` on the main port.
    #[arg(long, value_name = "PORT")]
    toolbox_port: Option<u16>,
    /// Outbound network for sandboxes. OFF by default: commands have only
    /// their sandbox's own loopback. With an allow-list (entries `any`,
    /// `host`, `host:port`, `*.domain`, `*.domain:port`; repeat the flag or
    /// separate with commas) each sandbox gets an HTTP/HTTPS (CONNECT)
    /// proxy on its loopback at 127.0.0.1:3128 and its commands get
    /// HTTP_PROXY/HTTPS_PROXY; other destinations are refused with 403.
    /// The host's loopback (this server's API included) is reachable only
    /// through an entry naming it exactly, never through `any`. A
    /// sandbox's own list (CreateOS `egress`, Daytona's network settings)
    /// only narrows this one. Needs sandbox machines (user namespaces).
    #[arg(long, value_name = "HOST[:PORT]")]
    egress: Vec<String>,
    /// Let clients open a sandbox's port as a loopback URL guarded by a
    /// secret token (Daytona's preview URLs; CreateOS sandboxes made with
    /// `ingress_enabled`). Off by default: asking is then a 403.
    #[arg(long)]
    ingress: bool,
}

fn parse_output_budget(text: &str) -> Result<u64, sandbox_engine::util::InvalidSize> {
    sandbox_engine::sandboxes::output_budget::parse_budget(text)
}

/// Why the command line cannot start a server: said to the person who
/// typed it.
#[derive(Debug, thiserror::Error)]
enum CliError {
    /// `--rate-limit` that is not `REQUESTS/WINDOW_MS`.
    #[error("invalid rate limit {text:?}: expected REQUESTS/WINDOW_MS, for example 20/2000")]
    RateLimit { text: String },
    /// `--api-key-file` that cannot be read.
    #[error("cannot read the API key file {}: {source}", .path.display())]
    KeyFileUnreadable {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    /// `--api-key-file` whose first line is empty.
    #[error("the API key file {} is empty", .path.display())]
    KeyFileEmpty { path: std::path::PathBuf },
    /// No key at all.
    #[error("an API key is required: set CREATEOS_API_KEY, or pass --api-key-file FILE")]
    NoKey,
}

fn parse_rate_limit(text: &str) -> Result<(u32, std::time::Duration), CliError> {
    let invalid = || CliError::RateLimit {
        text: text.to_string(),
    };
    let (requests, window) = text.split_once('/').ok_or_else(invalid)?;
    let requests: u32 = requests
        .trim()
        .parse()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(invalid)?;
    let window: u64 = window
        .trim()
        .parse()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(invalid)?;
    Ok((requests, std::time::Duration::from_millis(window)))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("createos-local: cannot start runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    rt.block_on(run(cli))
}

/// The key from --api-key / CREATEOS_API_KEY or --api-key-file.
fn api_key(cli: &Cli) -> Result<String, CliError> {
    if let Some(path) = &cli.api_key_file {
        let text = std::fs::read_to_string(path).map_err(|source| CliError::KeyFileUnreadable {
            path: path.clone(),
            source,
        })?;
        let key = text.lines().next().unwrap_or("").trim().to_string();
        if key.is_empty() {
            return Err(CliError::KeyFileEmpty { path: path.clone() });
        }
        return Ok(key);
    }
    match &cli.api_key {
        Some(key) if !key.is_empty() => Ok(key.clone()),
        _ => Err(CliError::NoKey),
    }
}

async fn run(cli: Cli) -> ExitCode {
    let egress = match sandbox_engine::network::egress::Policy::parse(&cli.egress) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("createos-local: cannot start: {e}");
            return ExitCode::FAILURE;
        }
    };
    let key = match api_key(&cli) {
        Ok(key) => key,
        Err(e) => {
            eprintln!("createos-local: {e}");
            return ExitCode::from(2);
        }
    };
    let mut builder = Server::builder()
        .api_key(key)
        .port(cli.port)
        .max_sandboxes(cli.max_sandboxes)
        .max_processes(cli.max_processes)
        .finished_retention(
            std::time::Duration::from_secs(cli.finished_ttl),
            cli.finished_keep,
        );
    if let Some(bytes) = cli.finished_output {
        builder = builder.finished_output(usize::try_from(bytes).unwrap_or(usize::MAX));
    }
    if let Some(size) = cli.sandbox_disk {
        builder = builder.sandbox_disk(size);
    }
    if let Some(bytes) = cli.sandbox_memory {
        builder = builder.sandbox_memory(bytes);
    }
    if let Some(dir) = cli.state_dir {
        builder = builder.state_dir(dir);
    }
    if let Some(dir) = cli.data_dir {
        builder = builder.data_dir(dir);
    }
    if let Some((requests, window)) = cli.rate_limit {
        builder = builder.rate_limit(requests, window);
    }
    if let Some(port) = cli.toolbox_port {
        builder = builder.toolbox_port(port);
    }
    builder = builder.allow_unconfined(cli.allow_unconfined);
    // The startup line says whether it applies (it needs sandbox machines).
    builder = builder.egress(egress).ingress(cli.ingress);
    builder = builder.isolation(match cli.isolation {
        Isolation::Auto => IsolationPreference::Auto,
        Isolation::Bwrap => IsolationPreference::RequireBwrap,
        Isolation::ProcessGroup => IsolationPreference::ProcessGroup,
    });
    let server = match builder.start().await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("createos-local: cannot start: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Signal handlers first: a SIGTERM sent as soon as the address is
    // printed stops the server gracefully, never with the default action.
    let signals = signals();
    let mut out = std::io::stdout().lock();
    let mut lines = format!("listening on {}\n", server.base_url());
    if let Some(toolbox) = server.toolbox_addr() {
        lines.push_str(&format!("toolbox on http://{toolbox}\n"));
    }
    if out
        .write_all(lines.as_bytes())
        .and_then(|()| out.flush())
        .is_err()
    {
        eprintln!("createos-local: cannot write to stdout");
    }
    drop(out);
    wait_for_signal(signals).await;
    eprintln!("createos-local: shutting down");
    if server.shutdown().await.all_exited() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

type Signals = std::io::Result<(tokio::signal::unix::Signal, tokio::signal::unix::Signal)>;

/// Handlers of SIGINT and SIGTERM.
fn signals() -> Signals {
    use tokio::signal::unix::{signal, SignalKind};
    Ok((
        signal(SignalKind::interrupt())?,
        signal(SignalKind::terminate())?,
    ))
}

async fn wait_for_signal(signals: Signals) {
    match signals {
        Ok((mut int, mut term)) => {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
