//! `sandbox lease acquire|exec|egress|port|release|destroy|list|sweep`:
//! leases kept in the durable store across `sandbox` processes.

use anyhow::{bail, Result};
use sandbox_host::types::AcquireRequest;

use crate::backend::{self, Setup};
use crate::{egress_policy, exec, ready, report, Global, LeaseCommand};

pub fn run(global: &Global, command: LeaseCommand) -> Result<u8> {
    if !matches!(command, LeaseCommand::Exec { .. } | LeaseCommand::List) {
        exec::finish_on_first_signal();
    }
    let uses_the_sandbox = !matches!(command, LeaseCommand::List);
    let code = run_command(global, command)?;
    if code != 0 && uses_the_sandbox {
        // A failure on a lease of a `sandbox engine` that is gone says so:
        // otherwise the user sees only "connection refused".
        if let Some(note) = backend::dead_engine_note(global) {
            eprintln!("sandbox: {note}");
        }
    }
    Ok(code)
}

fn run_command(global: &Global, command: LeaseCommand) -> Result<u8> {
    match command {
        LeaseCommand::Acquire {
            run_id,
            image,
            adapter_type,
            template,
        } => {
            let request = AcquireRequest {
                run_id,
                requested_cwd: None,
                workspace_mode: None,
                requested_expires_at: None,
                egress: egress_policy::parse(&global.egress)?,
                adapter_type,
                image,
                template,
            };
            let setup = ready(Setup::with_backend(global, false), global)?;
            let env = setup.environment(global)?;
            exec::acquire(&setup, &env, &request, global.json)
        }
        LeaseCommand::Egress { lease } => {
            let Some(policy) = egress_policy::parse(&global.egress)? else {
                bail!(
                    "give the lease's new policy with --egress (HOST[:PORT], *.DOMAIN[:PORT], \
                     IP[:PORT] or ADDRESS/PREFIX, repeatable; `none` blocks all, `*` is the \
                     service's default)"
                );
            };
            let setup = ready(Setup::for_stored_leases(global), global)?;
            let env = setup.environment_of(global, &lease)?;
            let outcome = setup.runtime.set_egress(&env, &lease, &policy)?;
            Ok(report::egress_set(&lease, &policy, &outcome, global.json))
        }
        LeaseCommand::Port { lease, port } => {
            let setup = ready(Setup::for_stored_leases(global), global)?;
            let env = setup.environment_of(global, &lease)?;
            let outcome = setup.runtime.open_port(&env, &lease, port)?;
            Ok(report::port_opened(&lease, &outcome, global.json))
        }
        LeaseCommand::Exec { lease, run } => {
            let setup = ready(Setup::for_stored_leases(global), global)?;
            let env = setup.environment_of(global, &lease)?;
            exec::exec(&setup, &env, &lease, &run)
        }
        LeaseCommand::Release { lease } => {
            let setup = ready(Setup::for_stored_leases(global), global)?;
            let env = setup.environment_of(global, &lease)?;
            let outcome = setup.runtime.release(&env, &lease)?;
            Ok(report::termination(
                "released",
                &lease,
                &outcome,
                global.json,
            ))
        }
        LeaseCommand::Destroy { lease } => {
            let setup = ready(Setup::for_stored_leases(global), global)?;
            let env = setup.environment_of(global, &lease)?;
            let outcome = setup.runtime.destroy(&env, &lease)?;
            Ok(report::termination(
                "destroyed",
                &lease,
                &outcome,
                global.json,
            ))
        }
        LeaseCommand::List => {
            let setup = ready(Setup::for_stored_leases(global), global)?;
            report::leases(&setup.runtime.store().list()?, global.json);
            Ok(0)
        }
        LeaseCommand::Sweep => {
            let setup = ready(Setup::for_stored_leases(global), global)?;
            exec::sweep(&setup, global)
        }
    }
}
