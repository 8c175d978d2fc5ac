//! `sandbox validate-config`: the provider's verdict on `--config`, with
//! no request.

use anyhow::Result;

use crate::backend::{self, Setup};
use crate::{ready, report, Global};

pub fn run(global: &Global) -> Result<u8> {
    let setup = ready(Setup::provider_only(global), global)?;
    let config = backend::read_config(global)?;
    let validation = setup.runtime.validate_config(&config)?;
    report::validation(&validation, global.json);
    Ok(if validation.ok { 0 } else { 1 })
}
