//! One file per `sandbox` subcommand.

pub mod describe;
pub mod doctor;
pub mod engine;
pub mod lease;
pub mod probe;
pub mod run;
pub mod template;
pub mod validate_config;
