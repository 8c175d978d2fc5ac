//! `sandbox describe`: who the provider is, its secrets, API origins and
//! config schema.

use anyhow::Result;

use crate::backend::Setup;
use crate::{ready, report, Global};

pub fn run(global: &Global) -> Result<u8> {
    let setup = ready(Setup::provider_only(global), global)?;
    report::description(setup.runtime.description(), global.json);
    Ok(0)
}
