//! `conformance`: runs the conformance kit against a provider component.
//!
//! ```sh
//! cargo run -p sandbox-conformance --bin conformance -- --provider my.wasm --config my-config.json
//! cargo run -p sandbox-conformance --bin conformance -- --target createos    # a workspace target, with faults
//! ```

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Parser;
use sandbox_conformance::{workspace_targets, Backend, LiveBackend, Scenario, Target, Verdict};
use serde_json::Value;

/// Runs the provider-neutral conformance scenarios against a provider
/// component: with --provider and --config, the fault-free scenarios
/// against the running backend the config names (fault scenarios report
/// "not applicable"); with --target, a workspace provider against its
/// local backend, faults included.
#[derive(Parser)]
#[command(name = "conformance")]
struct Args {
    /// The provider component (a `.wasm` built for sandbox:provider@0.7.0, 0.6.0, 0.5.0, 0.4.0, 0.3.0 or 0.2.0).
    #[arg(long, requires = "config", required_unless_present_any = ["target", "list"])]
    provider: Option<PathBuf>,
    /// The provider's config as a JSON file, naming its backend and holding
    /// its key (or {"env": "VAR"} / {"file": "/path"} in the key's field).
    #[arg(long, requires = "provider")]
    config: Option<PathBuf>,
    /// A workspace target instead (`createos`, `daytona`), on an
    /// in-process createos-local with fault injection.
    #[arg(long, conflicts_with_all = ["provider", "config"])]
    target: Option<String>,
    /// The config fields (JSON) that make leases reusable, for the reuse
    /// scenario, e.g. '{"reuseLease": true}'.
    #[arg(long, value_name = "JSON")]
    reuse: Option<String>,
    /// The backend runs its commands as processes of this machine: prove
    /// "nothing survived" with /proc scans.
    #[arg(long)]
    same_machine: bool,
    /// Spend no request rate limit (a local backend) instead of the
    /// provider's declared one.
    #[arg(long)]
    no_rate_limit: bool,
    /// Run only this scenario (repeatable; see --list).
    #[arg(long = "scenario", value_name = "NAME")]
    scenarios: Vec<String>,
    /// Print the scenario names and exit.
    #[arg(long)]
    list: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(error) => {
            eprintln!("conformance: {error:#}");
            ExitCode::from(2)
        }
    }
}

fn run(args: Args) -> Result<bool> {
    if args.list {
        for scenario in Scenario::all() {
            println!("{scenario}");
        }
        return Ok(true);
    }
    let mut target = match (&args.target, &args.provider, &args.config) {
        (Some(name), _, _) => match name.as_str() {
            "createos" => workspace_targets::createos(),
            "daytona" => workspace_targets::daytona(),
            other => bail!("unknown target {other:?}: the workspace targets are createos, daytona"),
        },
        (None, Some(provider), Some(config)) => live_target(provider, config, &args)?,
        _ => bail!("give --provider and --config, or --target"),
    };
    if let Some(reuse) = &args.reuse {
        let patch: Value = serde_json::from_str(reuse).context("--reuse is not JSON")?;
        if !patch.is_object() {
            bail!("--reuse must be a JSON object of config fields");
        }
        target = target.with_reuse(patch);
    }
    let scenarios = if args.scenarios.is_empty() {
        Scenario::all()
    } else {
        args.scenarios
            .iter()
            .map(|name| {
                Scenario::from_name(name)
                    .with_context(|| format!("no scenario {name:?} (see --list)"))
            })
            .collect::<Result<_>>()?
    };
    target.component()?;
    let width = scenarios.iter().map(|s| s.name().len()).max().unwrap_or(0);
    let (mut passed, mut not_applicable, mut failed) = (0, 0, 0);
    for scenario in scenarios {
        let line = match scenario.run(&target) {
            Ok(verdict @ Verdict::Passed(_)) => {
                passed += 1;
                verdict.to_string()
            }
            Ok(verdict @ Verdict::NotApplicable(_)) => {
                not_applicable += 1;
                verdict.to_string()
            }
            Err(error) => {
                failed += 1;
                format!("FAILED: {error:#}")
            }
        };
        println!("{:width$}  {line}", scenario.name());
    }
    println!(
        "{}: {passed} passed, {not_applicable} not applicable, {failed} failed",
        target.name()
    );
    Ok(failed == 0)
}

fn live_target(provider: &Path, config: &Path, args: &Args) -> Result<Target> {
    let text = std::fs::read_to_string(config)
        .with_context(|| format!("cannot read {}", config.display()))?;
    let config: Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", config.display()))?;
    if !config.is_object() {
        bail!("the config must be a JSON object");
    }
    let backend = LiveBackend::new(config).on_this_machine(args.same_machine);
    let name = provider
        .file_stem()
        .map_or("provider".into(), |s| s.to_string_lossy().into_owned());
    let target = Target::new(
        name,
        provider.to_path_buf(),
        Arc::new(move || Ok(Box::new(backend.clone()) as Box<dyn Backend>)),
    );
    Ok(if args.no_rate_limit {
        target
    } else {
        target.with_declared_rate_limit()
    })
}
