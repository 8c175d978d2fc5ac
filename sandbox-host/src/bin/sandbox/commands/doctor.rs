//! `sandbox doctor`: everything the embedded engine and the hosts rely on,
//! checked on this host in one table, with the one command that fixes each
//! missing piece (issue 39 item 3). Exit 0 when `sandbox run` works here
//! (bubblewrap confines commands, the data directory is writable, the
//! provider component loads), 1 otherwise; `--json` prints the rows.
//!
//! Every check asks the host the way the engine itself will: the same
//! bubblewrap probe, the same disk trial, the same store opener.

use anyhow::Result;
use serde_json::json;

use crate::Global;

/// How one check came out.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// Works as it should.
    Ok,
    /// Works, in a weaker form (said in the detail).
    Limited,
    /// Missing: `sandbox run` cannot work without it.
    Missing,
    /// Missing, but only a feature needs it.
    Optional,
}

impl Verdict {
    fn word(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Limited => "limited",
            Verdict::Missing => "MISSING",
            Verdict::Optional => "absent",
        }
    }
}

/// One row of the table.
struct Check {
    name: &'static str,
    verdict: Verdict,
    detail: String,
    /// The command (or step) that fixes it.
    fix: Option<String>,
}

fn check(name: &'static str, verdict: Verdict, detail: impl Into<String>) -> Check {
    Check {
        name,
        verdict,
        detail: detail.into(),
        fix: None,
    }
}

impl Check {
    fn fix(mut self, fix: impl Into<String>) -> Check {
        self.fix = Some(fix.into());
        self
    }
}

pub fn run(global: &Global) -> Result<u8> {
    let mut checks = Vec::new();
    checks.push(component(global));
    #[cfg(feature = "local-backend")]
    engine_checks(&mut checks);
    checks.push(data_directory(global));
    checks.push(lease_store(global));
    checks.extend(keys(global));
    let works = checks.iter().all(|c| c.verdict != Verdict::Missing);
    if global.json {
        let rows: Vec<_> = checks
            .iter()
            .map(|c| {
                json!({
                    "check": c.name, "verdict": c.verdict.word().to_lowercase(),
                    "detail": c.detail, "fix": c.fix,
                })
            })
            .collect();
        let report = json!({ "sandboxRunWorks": works, "checks": rows });
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        let width = checks.iter().map(|c| c.name.len()).max().unwrap_or(0);
        for c in &checks {
            println!("{:width$}  {:7}  {}", c.name, c.verdict.word(), c.detail);
            if let Some(fix) = &c.fix {
                println!("{:width$}           fix: {fix}", "");
            }
        }
        println!();
        if works {
            println!("verdict: `sandbox run` works here");
        } else {
            println!("verdict: `sandbox run` does NOT work here: fix the MISSING rows above");
        }
    }
    Ok(if works { 0 } else { 1 })
}

/// The provider component `--provider` names, compiled as `run` would.
fn component(global: &Global) -> Check {
    let source = match crate::backend::find_provider(global.provider.as_deref()) {
        Ok(s) => s,
        Err(e) => {
            return check("provider component", Verdict::Missing, format!("{e:#}"))
                .fix("pass --provider createos, --provider daytona or a component file")
        }
    };
    match crate::backend::Setup::provider_only(global) {
        Ok(_) => check("provider component", Verdict::Ok, source.label()),
        Err(e) => check(
            "provider component",
            Verdict::Missing,
            format!("{}: {e:#}", source.label()),
        )
        .fix("pass a component built for the sandbox-provider contract (sandbox --version lists the versions)"),
    }
}

#[cfg(feature = "local-backend")]
fn engine_checks(checks: &mut Vec<Check>) {
    use sandbox_engine::util::find_in_path;
    // bubblewrap and user namespaces: the engine's own probe.
    match find_in_path("bwrap") {
        None => checks.push(
            check("bubblewrap", Verdict::Missing, "bwrap is not installed")
                .fix("apt-get install bubblewrap   (Fedora: dnf install bubblewrap)"),
        ),
        Some(path) => {
            let version = std::process::Command::new(&path)
                .arg("--version")
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
                .unwrap_or_default();
            checks.push(check(
                "bubblewrap",
                Verdict::Ok,
                format!("{} ({version})", path.display()),
            ));
            checks.push(user_namespaces());
        }
    }
    let machines = sandbox_engine::machine::offered_here();
    checks.push(if machines {
        check(
            "machine model",
            Verdict::Ok,
            "one machine per sandbox: commands share its processes, loopback and files",
        )
    } else {
        check(
            "machine model",
            Verdict::Limited,
            format!(
                "FALLBACK, namespaces per command: nothing a command leaves running reaches the \
                 next ({})",
                sandbox_engine::machine::user_namespaces_refused().unwrap_or_default()
            ),
        )
        .fix("allow unprivileged user namespaces (sysctl -w user.max_user_namespaces=15000; Ubuntu 23.10+: aa-enforce bwrap-userns-restrict or sysctl -w kernel.apparmor_restrict_unprivileged_userns=0)")
    });
    // Which ids a sandbox's root owns (issue 37 item 2).
    if machines {
        use sandbox_engine::trees::id_map::{describe_here, own_ids_here, OwnIds};
        checks.push(match own_ids_here() {
            Some(OwnIds::OnlyRoot { why, fix }) => check(
                "sandbox ids",
                Verdict::Limited,
                format!("only uid 0 in a sandbox ({why}): chown to another id fails inside"),
            )
            .fix(fix.as_str()),
            _ => check("sandbox ids", Verdict::Ok, describe_here()),
        });
    }
    let proof = sandbox_engine::machine::tree_proof_offered_here();
    let pids_v1 = proof == sandbox_engine::machine::TreeProof::PidsGroup;
    checks.push(match (&proof, machines) {
        (_, false) => check(
            "tree proof",
            Verdict::Limited,
            "a PID namespace per command (its init's end ends the tree)",
        ),
        (sandbox_engine::machine::TreeProof::Anchor, true) => check(
            "tree proof",
            Verdict::Limited,
            proof.describe(),
        )
        .fix("give the engine a cgroup v2 group of its own: systemd-run --user --scope -p Delegate=yes sandbox ..."),
        (_, true) => check("tree proof", Verdict::Ok, proof.describe()),
    });
    checks.push(check(
        "process limit",
        Verdict::Ok,
        format!(
            "{} per sandbox (RLIMIT_NPROC{})",
            sandbox_engine::trees::process_limits::MAX_PROCESSES,
            if pids_v1 { " and its pids group" } else { "" }
        ),
    ));
    checks.push(if sandbox_engine::trees::process_limits::memory_limit_offered_here() {
        check(
            "memory limit",
            Verdict::Ok,
            format!(
                "{} MiB per sandbox by default, swap included (its cgroup memory group; createos-local --sandbox-memory)",
                sandbox_engine::trees::process_limits::default_sandbox_memory() >> 20
            ),
        )
    } else {
        check(
            "memory limit",
            Verdict::Limited,
            "not limited: no cgroup memory controller this user can use (no address-space limit is put in its place)",
        )
        .fix("run as root on a host with a cgroup v1 memory hierarchy, or in a cgroup v2 group delegated with the memory controller: systemd-run --user --scope -p Delegate=yes sandbox ...")
    });
    checks.push(check(
        "cpu limit",
        Verdict::Limited,
        "not limited (no CPU controller is used)",
    ));
    checks.push(disk());
    checks.push(if machines {
        check(
            "egress",
            Verdict::Ok,
            "off by default; --egress HOST[:PORT] gives each sandbox an allow-list proxy",
        )
    } else {
        check(
            "egress",
            Verdict::Limited,
            "none: sandboxes have only their own loopback (--egress needs one machine per sandbox)",
        )
    });
}

/// Whether bwrap can make its namespaces here, as the engine probes it.
#[cfg(feature = "local-backend")]
fn user_namespaces() -> Check {
    let dir = std::env::temp_dir().join(format!("sandbox-doctor-{}", std::process::id()));
    // The probe's sandbox sees the `/etc` copy every sandbox of a data
    // directory shares, as in the engine.
    let probed = std::fs::create_dir_all(&dir)
        .and_then(|()| sandbox_engine::storage::rootfs::prepare_etc(&dir))
        .map_err(|e| format!("cannot prepare a trial sandbox in {}: {e}", dir.display()))
        .and_then(|_| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())
        })
        .and_then(|rt| {
            rt.block_on(sandbox_engine::machine::isolation::probe_bwrap(
                &dir.join("probe"),
                &sandbox_engine::machine::ServerRegistries::default(),
            ))
            .map_err(|e| e.to_string())
        });
    sandbox_engine::storage::rootfs::remove_etc(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    match probed {
        Ok(_) => check(
            "user namespaces",
            Verdict::Ok,
            "bwrap makes user, PID, network, IPC and UTS namespaces here",
        ),
        Err(why) => {
            let read = |p: &str| std::fs::read_to_string(p).map(|s| s.trim().to_string());
            let fix = if read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns")
                .is_ok_and(|v| v == "1")
            {
                "Ubuntu's AppArmor restricts user namespaces: aa-enforce /etc/apparmor.d/bwrap-userns-restrict \
                 (or sysctl kernel.apparmor_restrict_unprivileged_userns=0)"
            } else if read("/proc/sys/kernel/unprivileged_userns_clone").is_ok_and(|v| v == "0") {
                "sysctl kernel.unprivileged_userns_clone=1"
            } else if read("/proc/sys/user/max_user_namespaces").is_ok_and(|v| v == "0") {
                "sysctl user.max_user_namespaces=15000"
            } else {
                "allow unprivileged user namespaces on this host (in a container: run it with them allowed)"
            };
            check("user namespaces", Verdict::Missing, why).fix(fix)
        }
    }
}

/// Whether each sandbox gets a disk of its own: the engine's disk trial.
#[cfg(feature = "local-backend")]
fn disk() -> Check {
    let dir = std::env::temp_dir().join(format!("sandbox-doctor-disk-{}", std::process::id()));
    let trial = std::fs::create_dir_all(&dir)
        .map_err(|e| e.to_string())
        .and_then(|()| {
            sandbox_engine::storage::disk::probe(
                &dir,
                sandbox_engine::storage::disk::MIN_SANDBOX_DISK,
                None,
            )
            .map_err(|e| e.to_string())
        });
    let _ = std::fs::remove_dir_all(&dir);
    match trial {
        Ok(()) => check(
            "disk per sandbox",
            Verdict::Ok,
            "an ext4 image per sandbox (ENOSPC inside, the host's disk stays free)",
        ),
        Err(why) => check(
            "disk per sandbox",
            Verdict::Limited,
            format!("no per-sandbox disk quota: {why}"),
        )
        .fix(
            "run as root with loop devices, mkfs.ext4 and mount (apt-get install e2fsprogs mount)",
        ),
    }
}

/// The data directory: made if missing, and writable.
fn data_directory(global: &Global) -> Check {
    let dir = crate::backend::data_dir(global);
    let probe = dir.join(format!(".doctor-{}", std::process::id()));
    let written = std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&probe, b"ok"));
    let _ = std::fs::remove_file(&probe);
    match written {
        Ok(()) => check(
            "data directory",
            Verdict::Ok,
            format!("{} (writable)", dir.display()),
        ),
        Err(e) => check(
            "data directory",
            Verdict::Missing,
            format!("{}: {e}", dir.display()),
        )
        .fix("pass --data-dir DIR (or SANDBOX_DATA_DIR) naming a directory you can write"),
    }
}

/// The lease store `--store` names (or the SQLite file), opened as the
/// lease commands open it.
fn lease_store(global: &Global) -> Check {
    let Some(url) = &global.store else {
        let file = crate::backend::data_dir(global).join("leases.sqlite");
        return match sandbox_host::SqliteLeases::open(&file) {
            Ok(_) => check(
                "lease store",
                Verdict::Ok,
                format!("SQLite {}", file.display()),
            ),
            Err(e) => check(
                "lease store",
                Verdict::Optional,
                format!("SQLite {}: {e:#}", file.display()),
            )
            .fix("pass --data-dir DIR naming a writable directory, or --store postgres://..."),
        };
    };
    match sandbox_host::open_store(url) {
        Ok(_) => check("lease store", Verdict::Ok, "opened (--store)"),
        Err(e) => check("lease store", Verdict::Optional, format!("{e:#}"))
            .fix("check the --store URL and that the database answers (pg_isready -d URL)"),
    }
}

/// Where each provider's key would come from, for the real services.
fn keys(global: &Global) -> Vec<Check> {
    [
        ("CreateOS", "CREATEOS_API_KEY"),
        ("Daytona", "DAYTONA_API_KEY"),
    ]
    .into_iter()
    .map(|(service, var)| {
        let name = if service == "CreateOS" {
            "CreateOS key"
        } else {
            "Daytona key"
        };
        if global.api_key_file.is_some() {
            check(name, Verdict::Ok, "from --api-key-file")
        } else if std::env::var_os(var).is_some_and(|v| !v.is_empty()) {
            check(name, Verdict::Ok, format!("from {var}"))
        } else {
            check(
                name,
                Verdict::Optional,
                format!("not set: only the embedded engine, not {service}'s service"),
            )
            .fix(format!(
                "export {var}=... or pass --api-key-file FILE (only for the real service)"
            ))
        }
    })
    .collect()
}
