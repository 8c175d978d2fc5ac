//! `sandbox run -- CMD`: acquire, run with live output, release.

use anyhow::Result;

use crate::backend::Setup;
use crate::{exec, ready, Global, RunArgs};

pub fn run(global: &Global, args: &RunArgs) -> Result<u8> {
    let setup = ready(Setup::with_backend(global, true), global)?;
    if let Some(line) = setup.weaker_model() {
        eprintln!("{line}");
    }
    let code = exec::run(&setup, global, args);
    setup.finish();
    code
}
