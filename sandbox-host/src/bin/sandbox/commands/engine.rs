//! `sandbox engine`: the embedded engine served until a signal, so that
//! `sandbox lease acquire|exec|release` in other processes (other shells,
//! scripts) can use it without building and starting `createos-local`.

use anyhow::{Context, Result};

use crate::backend::Engine;
use crate::{Global, EXIT_CLEANUP_FAILED};

pub fn run(global: &Global, port: Option<u16>, ingress: bool) -> Result<u8> {
    let engine = Engine::start(global, port, ingress)?;
    let mut line = format!(
        "export SANDBOX_CONFIG={} SANDBOX_API_KEY_FILE={}",
        shell_word(&engine.config_file.display().to_string()),
        shell_word(&engine.key_file.display().to_string()),
    );
    if let Some(provider) = &global.provider {
        line.push_str(&format!(
            " SANDBOX_PROVIDER={}",
            shell_word(&provider.display().to_string())
        ));
    }
    // The handlers exist before the line is printed: a script that reads
    // it and signals the engine at once must not kill it unstopped.
    let signals = Signals::install()?;
    for (field, url) in engine.urls() {
        eprintln!("sandbox: engine {field} {url}");
    }
    eprintln!(
        "sandbox: serving until Ctrl-C, SIGTERM or SIGHUP (stopping ends every sandbox in it); \
         point other shells at it with:"
    );
    println!("{line}");
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let signal = signals.wait();
    eprintln!("sandbox: {signal}; stopping the engine and every sandbox in it");
    if engine.stop() {
        eprintln!("sandbox: the engine stopped; every process in it exited");
        Ok(0)
    } else {
        Ok(EXIT_CLEANUP_FAILED)
    }
}

/// SIGINT, SIGTERM and SIGHUP, caught from [`Signals::install`] on.
struct Signals {
    runtime: tokio::runtime::Runtime,
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the signal handler")?;
        let (int, term, hup) = runtime.block_on(async {
            anyhow::Ok((
                signal(SignalKind::interrupt())?,
                signal(SignalKind::terminate())?,
                signal(SignalKind::hangup())?,
            ))
        })?;
        Ok(Signals {
            runtime,
            int,
            term,
            hup,
        })
    }

    /// Waits for the first of them and names it.
    fn wait(mut self) -> &'static str {
        self.runtime.block_on(async {
            tokio::select! {
                _ = self.int.recv() => "interrupted (Ctrl-C)",
                _ = self.term.recv() => "terminated (SIGTERM)",
                _ = self.hup.recv() => "hung up (SIGHUP)",
            }
        })
    }
}

/// `text` as one shell word (single-quoted unless plainly safe).
fn shell_word(text: &str) -> String {
    let plain = !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-+:@,=".contains(&b));
    if plain {
        text.to_owned()
    } else {
        format!("'{}'", text.replace('\'', r"'\''"))
    }
}
