//! The lease store: the backend trait and host liveness, its SQLite and
//! PostgreSQL implementations, the store URL, and the state machine both
//! apply.

pub(crate) mod backend;
pub(crate) mod local;
pub(crate) mod postgres;
pub mod rules;
pub(crate) mod sqlite;
pub(crate) mod url;
