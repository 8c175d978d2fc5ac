//! `sandbox template create|list|delete`: templates of the provider
//! (contract 0.7.0, capability `templates`), a sandbox's files kept under
//! a name for new leases to start from.

use anyhow::Result;

use crate::backend::Setup;
use crate::{exec, ready, report, Global, TemplateCommand};

pub fn run(global: &Global, command: TemplateCommand) -> Result<u8> {
    exec::finish_on_first_signal();
    match command {
        TemplateCommand::Create { lease, name } => {
            let setup = ready(Setup::for_stored_leases(global), global)?;
            let env = setup.environment_of(global, &lease)?;
            let template = match setup.runtime.capture_template(&env, &lease, &name)? {
                Ok(template) => template,
                Err(error) => return Ok(report::failed(&format!("lease {lease}"), &error)),
            };
            // The provider left the sandbox paused or stopped to capture
            // it: the lease is released, as the contract asks of hosts.
            let released = setup.runtime.release(&env, &lease)?;
            Ok(report::template_captured(
                &lease,
                &template,
                &released,
                global.json,
            ))
        }
        TemplateCommand::List => {
            let setup = ready(Setup::with_backend(global, false), global)?;
            let env = setup.environment(global)?;
            let outcome = setup.runtime.list_templates(&env)?;
            Ok(report::templates(&outcome, global.json))
        }
        TemplateCommand::Delete { template_ref } => {
            let setup = ready(Setup::with_backend(global, false), global)?;
            let env = setup.environment(global)?;
            let outcome = setup.runtime.delete_template(&env, &template_ref)?;
            Ok(report::template_deleted(
                &template_ref,
                &outcome,
                global.json,
            ))
        }
    }
}
