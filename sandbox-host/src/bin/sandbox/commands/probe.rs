//! `sandbox probe`: create a sandbox, run a marker command, delete it.

use anyhow::Result;

use crate::backend::Setup;
use crate::{exec, ready, report, Global};

pub fn run(global: &Global) -> Result<u8> {
    exec::finish_on_first_signal();
    let setup = ready(Setup::with_backend(global, true), global)?;
    let env = setup.environment(global)?;
    let outcome = setup.runtime.probe(&env, None)?;
    let code = report::probe(&outcome, global.json);
    setup.finish();
    Ok(code)
}
