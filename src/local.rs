//! A backend the kit starts itself: an in-process `createos-local`
//! ([`BackgroundServer`]) serving one provider's API face over real
//! processes, with a fresh random key, and the face's map from fault points
//! to the server's fault rules.

use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{bail, Context, Result};
use sandbox_engine::{BackgroundServer, FaultRule, Server, ServerBuilder};
use serde_json::Value;

use crate::backend::Backend;
use crate::fault::FaultPoint;

/// How one API face of `createos-local` is started, configured and broken.
#[derive(Clone, Copy)]
pub struct LocalFace {
    /// Adds what the face needs to the server (for example a second
    /// listener); the kit has already set the key and `quiet`.
    pub builder: fn(ServerBuilder) -> ServerBuilder,
    /// The provider config naming the running server, without the key.
    pub config: fn(&BackgroundServer) -> Value,
    /// The config field the key goes in (`apiKey`).
    pub secret_field: &'static str,
    /// The server's fault rules producing each point (empty: the face
    /// cannot produce it). Every rule applies to every matching request.
    pub faults: fn(FaultPoint) -> Vec<FaultRule>,
}

/// A running `createos-local` for one scenario.
pub struct LocalBackend {
    server: Option<BackgroundServer>,
    face: LocalFace,
    key: String,
}

impl LocalBackend {
    /// Starts a server for `face` with a fresh key.
    pub fn start(face: LocalFace) -> Result<LocalBackend> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let key = format!(
            "kitsecret{}n{}n{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed),
            crate::procs::unique_marker()
        );
        let builder = (face.builder)(Server::builder().api_key(key.clone()).quiet(true));
        let server = BackgroundServer::start(builder)
            .context("the local backend (createos-local) did not start")?;
        Ok(LocalBackend {
            server: Some(server),
            face,
            key,
        })
    }

    /// The server.
    pub fn server(&self) -> &BackgroundServer {
        self.server.as_ref().expect("the server runs until stop")
    }
}

impl Backend for LocalBackend {
    fn config(&self) -> Value {
        let mut config = (self.face.config)(self.server());
        if let Some(object) = config.as_object_mut() {
            object.insert(
                self.face.secret_field.to_owned(),
                Value::String(self.key.clone()),
            );
        }
        config
    }

    fn supports(&self, point: FaultPoint) -> bool {
        !(self.face.faults)(point).is_empty()
    }

    fn inject(&self, point: FaultPoint) -> Result<()> {
        let rules = (self.face.faults)(point);
        if rules.is_empty() {
            bail!("this backend cannot produce the fault {}", point.name());
        }
        for rule in rules {
            self.server().faults().add(rule.always());
        }
        Ok(())
    }

    fn clear_faults(&self) {
        self.server().faults().clear();
    }

    fn processes_on_this_machine(&self) -> bool {
        true
    }

    fn stop(mut self: Box<Self>) -> Result<()> {
        let Some(server) = self.server.take() else {
            return Ok(());
        };
        let report = server.shutdown();
        if !report.all_exited() {
            bail!(
                "the local backend could not verify every process gone at shutdown: \
                 {} tree(s) unverified, pids still alive: {:?}",
                report.unverified.len(),
                report.survivors
            );
        }
        Ok(())
    }
}
