//! The lease store: the backend trait and host liveness, the lease
//! operations written once over a SQL dialect (`sql`), its SQLite and
//! PostgreSQL dialects, the store URL, and the state machine both apply.

pub(crate) mod backend;
pub(crate) mod local;
pub(crate) mod postgres;
/// The lease state machine: states, operations and the transition rules
/// every store applies.
pub mod rules;
pub(crate) mod sql;
pub(crate) mod sqlite;
pub(crate) mod url;
