//! `sandbox`: run commands in sandboxes through any sandbox-provider
//! component. See `sandbox --help`.

mod backend;
mod commands;
mod egress_policy;
mod embedded;
mod exec;
mod interactive;
mod live;
mod report;
mod stdin;
mod terminal;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};

use backend::Setup;
use sandbox_host::Liveness;

/// Exit status when the sandbox itself failed (config, API, transport, trap).
pub const EXIT_SANDBOX_ERROR: u8 = 125;
/// Exit status when the command hit its timeout (as `timeout(1)`).
pub const EXIT_TIMED_OUT: u8 = 124;
/// Exit status when cleanup could not be confirmed: something may still
/// run; the lease was poisoned and destroyed (or left for `lease sweep`).
pub const EXIT_CLEANUP_FAILED: u8 = 120;
/// Exit status when the reader of this process's stdout or stderr closed
/// it while the command printed (128 + SIGPIPE, as a pipeline's writer):
/// the command was stopped, its output not all delivered.
pub const EXIT_READER_CLOSED: u8 = 141;
/// Exit status after Ctrl-C, SIGTERM or SIGHUP (the command was cancelled
/// and cleaned up). A second signal abandons the cleanup: exit 120.
pub const EXIT_INTERRUPTED: u8 = 130;

/// Run commands in sandboxes through a sandbox-provider WebAssembly component.
///
/// With no options, `sandbox run -- CMD` uses the CreateOS provider built
/// into this binary and an embedded CreateOS-compatible backend on a
/// loopback port.
///
/// Exit status of `run` and `lease exec`: the command's own; 124 when it
/// timed out; 120 when cleanup could not be confirmed (lease poisoned, or
/// a second Ctrl-C abandoned the cleanup); 125 for a sandbox failure; 130
/// after Ctrl-C, SIGTERM or SIGHUP (cancelled and cleaned up).
///
/// `-t` gives the command a terminal (`sandbox lease exec -t LEASE -- bash`
/// is a shell), `-i` passes stdin on while it runs (as `docker exec -it`).
#[derive(Debug, Parser)]
#[command(name = "sandbox", version)]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    command: Command,
}

/// Options every subcommand takes.
#[derive(Debug, Args, Clone)]
pub struct Global {
    /// The provider component: a .wasm file, or the name of one built into
    /// this binary (`createos`, the default, or `daytona`).
    #[arg(
        long,
        global = true,
        env = "SANDBOX_PROVIDER",
        value_name = "FILE|NAME"
    )]
    pub provider: Option<PathBuf>,
    /// The provider config, a JSON object.
    #[arg(long, global = true, env = "SANDBOX_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The provider's API URL (sets its first URL field, `apiUrl` for
    /// CreateOS and Daytona); without it and without a URL in the config,
    /// an embedded local engine is started.
    #[arg(long, global = true, value_name = "URL")]
    pub api_url: Option<String>,
    /// A file holding the API key (else the config, else the provider's
    /// declared environment variable, for example CREATEOS_API_KEY).
    #[arg(long, global = true, env = "SANDBOX_API_KEY_FILE", value_name = "FILE")]
    pub api_key_file: Option<PathBuf>,
    /// The API's rate limit as REQUESTS/WINDOW_MS[/PER_SECOND] (for example
    /// 300/60000), instead of the one the provider declares: your account's
    /// limit. Every `sandbox` process with the same data directory shares it.
    #[arg(long, global = true, env = "SANDBOX_RATE_LIMIT", value_name = "LIMIT")]
    pub rate_limit: Option<String>,
    /// Where the lease store lives (default: $XDG_DATA_HOME/sandbox or ~/.local/share/sandbox).
    #[arg(long, global = true, env = "SANDBOX_DATA_DIR", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// The lease store: postgres://USER@HOST[:PORT]/DATABASE for a store
    /// several hosts share, or an SQLite file (default: leases.sqlite in
    /// the data directory).
    #[arg(long, global = true, env = "SANDBOX_STORE", value_name = "URL")]
    pub store: Option<String>,
    /// The company (tenant) id.
    #[arg(long, global = true, default_value = "local")]
    pub company: String,
    /// The environment id.
    #[arg(long, global = true, default_value = "default")]
    pub environment: String,
    /// Print machine-readable JSON.
    #[arg(long, global = true)]
    pub json: bool,
    /// Show the provider component's own stderr (debugging).
    #[arg(long, global = true)]
    pub verbose: bool,
    /// How the embedded local backend confines commands: `bwrap` (the
    /// default; refused with an install hint when bubblewrap cannot run
    /// here) or `process-group`, which is NO isolation (commands run as
    /// you, on your file system and network).
    #[arg(long, global = true, value_enum, default_value_t = Isolation::Bwrap)]
    pub isolation: Isolation,
    /// Outbound network (repeat or separate with commas).
    ///
    /// With `run` and `engine`: the embedded local backend's allow-list,
    /// OFF by default. `any`, `host`, `host:port`, `*.domain`,
    /// `*.domain:port` give each sandbox an HTTP/HTTPS proxy
    /// (HTTP_PROXY/HTTPS_PROXY set for commands) that reaches only those
    /// destinations; the host's loopback only when named exactly. Needs
    /// root with a writable cgroup v1 pids hierarchy.
    ///
    /// With `lease acquire` and `lease egress`: the lease's own egress
    /// policy, enforced by the provider's service (capability
    /// `egress-policy`, see `sandbox describe`): HOST[:PORT],
    /// *.DOMAIN[:PORT], IP[:PORT] or ADDRESS/PREFIX (a CIDR, any port);
    /// `none` alone blocks every destination, `*` alone is the service's
    /// default. A provider that cannot enforce it refuses it before
    /// anything is created.
    #[arg(long, global = true, value_name = "HOST[:PORT]|CIDR")]
    pub egress: Vec<String>,
    /// How often this process refreshes its heartbeat in the lease store.
    #[arg(long, global = true, env = "SANDBOX_HEARTBEAT", value_parser = parse_duration,
          default_value = "2s", value_name = "DUR")]
    pub heartbeat: Duration,
    /// After how long without a heartbeat other `sandbox` processes treat
    /// this one as gone and poison the leases it was using.
    #[arg(long, global = true, env = "SANDBOX_HOST_EXPIRY", value_parser = parse_duration,
          default_value = "10s", value_name = "DUR")]
    pub host_expiry: Duration,
}

impl Global {
    fn liveness(&self) -> Result<Liveness> {
        Liveness::new(self.heartbeat, self.host_expiry)
    }
}

/// Applies the global settings every setup needs (the host's liveness).
/// A setup with this process's liveness settings applied.
pub fn ready(setup: Result<Setup>, global: &Global) -> Result<Setup> {
    let setup = setup?;
    setup.runtime.set_liveness(global.liveness()?)?;
    Ok(setup)
}

/// The embedded backend's isolation (see `--isolation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Isolation {
    /// bubblewrap namespaces per command, or refuse to run.
    Bwrap,
    /// NO isolation: unconfined process groups on the host.
    ProcessGroup,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Acquire a sandbox, run one command with live output, release it.
    Run(RunArgs),
    /// Show the provider's description (driver key, schema, capabilities).
    Describe,
    /// Validate the config (no network).
    ValidateConfig,
    /// Create a sandbox, run a marker command in it, delete it.
    Probe,
    /// Manage leases kept in the lease store.
    #[command(subcommand)]
    Lease(LeaseCommand),
    /// Templates: a sandbox's files kept under a name, that new leases
    /// start from (`lease acquire --template REF`). Needs a provider that
    /// claims `templates` (see `sandbox describe`).
    #[command(subcommand)]
    Template(TemplateCommand),
    /// Serve the embedded engine until Ctrl-C, SIGTERM or SIGHUP, for the
    /// lease commands of other `sandbox` processes: prints the line that
    /// points them at it (`export SANDBOX_CONFIG=… SANDBOX_API_KEY_FILE=…`).
    /// Stopping it ends every sandbox in it.
    Engine {
        /// The loopback port of its API (0: any free port). Default: the
        /// port of the engine that served this data directory before, when
        /// it is free (so that its leases reach this one), else any.
        #[arg(long)]
        port: Option<u16>,
        /// Let leases open their sandboxes' ports (`sandbox lease port`):
        /// each as a loopback URL guarded by a secret token of its own.
        /// Off by default: opening a port is then refused, saying so. The
        /// config it writes asks the provider for sandboxes that allow it
        /// (when the provider has such a field, CreateOS `ingress`).
        #[arg(long)]
        ingress: bool,
    },
    /// Check what this host gives the embedded engine and the hosts, and
    /// say how to fix what it lacks (exit 0 when `sandbox run` works here).
    Doctor,
    /// Print a shell completion script (bash, zsh, fish, elvish or
    /// powershell), for example
    /// `sandbox completions bash > ~/.local/share/bash-completion/completions/sandbox`.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff), for example
    /// `sandbox man > ~/.local/share/man/man1/sandbox.1`.
    Man,
}

/// A command to run and its limits.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// How long the command may run (for example 30s, 500ms, 5m).
    #[arg(long, value_parser = parse_duration, value_name = "DUR")]
    pub timeout: Option<Duration>,
    /// The working directory inside the sandbox.
    #[arg(long, value_name = "DIR")]
    pub cwd: Option<String>,
    /// Extra environment variables, NAME=VALUE.
    #[arg(long = "env", short = 'e', value_name = "NAME=VALUE")]
    pub env: Vec<String>,
    /// Keep standard input open and pass it on to the command as it comes
    /// (as `docker exec -i`): the command reads each line while it runs;
    /// the input's end closes its stdin. Needs a provider that claims
    /// `duplex-channels`. (Before, `-i` read this terminal to its end
    /// before the command started: that is `--stdin -` now.)
    #[arg(short = 'i', long, conflicts_with_all = ["stdin_file", "no_stdin"])]
    pub interactive: bool,
    /// Give the command a terminal (as `docker exec -it` or `ssh -t`): a
    /// pseudo-terminal in the sandbox of this terminal's size, resized
    /// with it, and this terminal in raw mode, so every key (Ctrl-C
    /// included) goes to the command; restored when it ends. Implies
    /// `-i`. Needs a provider that claims `login-pty` (`terminal-resize`
    /// to follow a resize). Without --timeout an interactive command may
    /// run 24 h.
    #[arg(short = 't', long, conflicts_with_all = ["stdin_file", "no_stdin"])]
    pub tty: bool,
    /// Give the command this file as its standard input (`-`: this
    /// process's stdin, even a terminal, read to its end first), at most
    /// 32 MiB.
    #[arg(long = "stdin", value_name = "FILE", conflicts_with = "no_stdin")]
    pub stdin_file: Option<PathBuf>,
    /// Give the command an empty standard input (do not read this
    /// process's stdin even when it is a pipe).
    #[arg(long)]
    pub no_stdin: bool,
    /// The input read for the command (see the `stdin` module).
    #[arg(skip)]
    pub input: Option<Vec<u8>>,
    /// The command and its arguments.
    #[arg(required = true, last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

#[derive(Debug, Subcommand)]
enum LeaseCommand {
    /// Acquire a lease and print its id (needs a backend that outlives this
    /// process: --api-url or apiUrl). `--egress` gives the lease its own
    /// egress policy (see `sandbox --help`).
    Acquire {
        /// The run the lease is for.
        #[arg(long, default_value = "cli")]
        run_id: String,
        /// The image the sandbox starts from, instead of the config's
        /// (the service's syntax; capability `images`).
        #[arg(long, value_name = "IMAGE", conflicts_with = "template")]
        image: Option<String>,
        /// The agent adapter the run uses (for example `claude_local`): a
        /// provider with `images` starts the sandbox from the image its
        /// config names for it; others ignore it.
        #[arg(long = "adapter", value_name = "TYPE")]
        adapter_type: Option<String>,
        /// A template to start the sandbox from (a reference from
        /// `sandbox template list`; capability `templates`).
        #[arg(long, value_name = "REF")]
        template: Option<String>,
    },
    /// Replace the egress policy of an active lease with the `--egress`
    /// values (`none` blocks all, `*` is the service's default); it holds
    /// for every connection opened afterwards. Needs a provider that
    /// claims `egress-policy`.
    Egress {
        /// The lease id.
        lease: String,
    },
    /// Make a port of an active lease's sandbox reachable from outside
    /// and print its URL and the headers every request to it must carry.
    /// The header values are secrets: pass them only to whoever the port
    /// is for. Needs a provider that claims `ports` and whose service has
    /// ingress on.
    Port {
        /// The lease id.
        lease: String,
        /// The port inside the sandbox (1-65535).
        #[arg(value_parser = clap::value_parser!(u16).range(1..))]
        port: u16,
    },
    /// Run a command on an active lease.
    Exec {
        /// The lease id (from `lease acquire` or `lease list`).
        lease: String,
        #[command(flatten)]
        run: RunArgs,
    },
    /// Release a lease (pause or delete it).
    Release {
        /// The lease id.
        lease: String,
    },
    /// Destroy a lease's sandbox; clears a poisoned lease.
    Destroy {
        /// The lease id.
        lease: String,
    },
    /// List the leases in the store.
    List,
    /// Destroy every poisoned lease.
    Sweep,
}

#[derive(Debug, Subcommand)]
enum TemplateCommand {
    /// Keep an active lease's sandbox's files as a template named NAME,
    /// then release the lease (the provider pauses or stops the sandbox
    /// to capture it). Prints the template's reference.
    Create {
        /// The lease id.
        lease: String,
        /// The template's name: 1-47 of letters, digits, `.`, `_` and `-`.
        name: String,
    },
    /// List the templates of this company and environment, oldest first.
    List,
    /// Delete a template (leases started from it are left alone).
    Delete {
        /// The template's reference (from `sandbox template list`).
        template_ref: String,
    },
}

/// The command line, with `--version` naming the contract versions this
/// host serves and the components it carries.
fn parse_command_line() -> Cli {
    use clap::{CommandFactory, FromArgMatches};
    let version: &'static str = Box::leak(embedded::version_text().into_boxed_str());
    let matches = Cli::command().version(version).get_matches();
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

fn main() -> ExitCode {
    let cli = parse_command_line();
    match dispatch(cli) {
        Ok(code) => ExitCode::from(code),
        Err(error) => {
            eprintln!("sandbox: {error:#}");
            ExitCode::from(EXIT_SANDBOX_ERROR)
        }
    }
}

fn dispatch(cli: Cli) -> Result<u8> {
    let global = cli.global;
    match cli.command {
        Command::Describe => commands::describe::run(&global),
        Command::ValidateConfig => commands::validate_config::run(&global),
        Command::Probe => commands::probe::run(&global),
        Command::Run(mut args) => {
            args.input = stdin::read(&args)?;
            commands::run::run(&global, &args)
        }
        Command::Lease(LeaseCommand::Exec { lease, mut run }) => {
            run.input = stdin::read(&run)?;
            commands::lease::run(&global, LeaseCommand::Exec { lease, run })
        }
        Command::Lease(command) => commands::lease::run(&global, command),
        Command::Template(command) => commands::template::run(&global, command),
        Command::Engine { port, ingress } => commands::engine::run(&global, port, ingress),
        Command::Doctor => commands::doctor::run(&global),
        Command::Completions { shell } => {
            use clap::CommandFactory;
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "sandbox", &mut script);
            print_generated(&script)
        }
        Command::Man => {
            use clap::CommandFactory;
            let mut page = Vec::new();
            clap_mangen::Man::new(Cli::command()).render(&mut page)?;
            print_generated(&page)
        }
    }
}

/// Writes a generated script or page to stdout; a reader that closed
/// early (`| head`) is not an error.
fn print_generated(bytes: &[u8]) -> Result<u8> {
    use std::io::Write;
    match std::io::stdout().lock().write_all(bytes) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(0),
    }
}

/// Parses `500ms`, `30s`, `5m`, `1h`, or a plain number of seconds.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit) = match text.find(|c: char| !c.is_ascii_digit() && c != '.') {
        Some(at) => text.split_at(at),
        None => (text, "s"),
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("invalid duration {text:?} (try 30s, 500ms, 5m)"))?;
    let seconds = match unit {
        "ms" => value / 1000.0,
        "s" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        _ => {
            return Err(format!(
                "invalid duration unit in {text:?} (use ms, s, m or h)"
            ))
        }
    };
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("invalid duration {text:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert!(parse_duration("3 days").is_err());
    }
}
