//! The wasmtime [`Engine`] this crate expects: component model on, epoch
//! interruption on, and one ticker thread per engine.

use std::sync::OnceLock;
use std::thread;
use std::time::Duration;

use anyhow::{Context, Result};
use wasmtime::{Config, Engine};

/// How often the engine's epoch advances. Deadlines are rounded up to it.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Creates an engine configured for provider components and starts its
/// epoch ticker thread (which ends when the last clone of the engine drops).
///
/// Every [`ProviderComponent`](crate::ProviderComponent) must be compiled
/// with an engine made here: stores rely on epoch interruption for their
/// deadline.
pub fn new_engine() -> Result<Engine> {
    let mut config = Config::new();
    config.wasm_component_model(true);
    config.epoch_interruption(true);
    let engine = Engine::new(&config)
        .map_err(anyhow::Error::from)
        .context("creating the wasmtime engine")?;
    start_epoch_ticker(&engine)?;
    Ok(engine)
}

/// A process-wide engine made by [`new_engine`] on first use. Handy for tests
/// and for a CLI that loads one component.
pub fn shared_engine() -> Result<Engine> {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    if let Some(engine) = ENGINE.get() {
        return Ok(engine.clone());
    }
    let engine = new_engine()?;
    Ok(ENGINE.get_or_init(|| engine).clone())
}

fn start_epoch_ticker(engine: &Engine) -> Result<()> {
    let weak = engine.weak();
    thread::Builder::new()
        .name("sandbox-host-epoch".into())
        .spawn(move || loop {
            thread::sleep(EPOCH_TICK);
            match weak.upgrade() {
                Some(engine) => engine.increment_epoch(),
                None => break,
            }
        })
        .context("starting the epoch ticker thread")?;
    Ok(())
}

/// The number of epoch ticks that covers `deadline` (at least one).
pub(crate) fn ticks_for(deadline: Duration) -> u64 {
    let tick = EPOCH_TICK.as_nanos();
    let ticks = deadline.as_nanos().div_ceil(tick).max(1);
    u64::try_from(ticks).unwrap_or(u64::MAX / 2)
}
