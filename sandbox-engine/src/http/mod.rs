//! The HTTP layer both faces sit on: the shared state ([`state`]), the
//! error answer before a face renders it ([`error`]), input limits, file
//! streaming, and the router and middleware chain of an origin, which ask
//! each face ([`middleware::Face`]) for what differs: its paths, how the
//! key is presented, how errors read. The CreateOS face ([`crate::api`])
//! and the Daytona face ([`crate::daytona`]) depend on this layer, never
//! on each other; what both answer alike lives here (the input rules of
//! [`input`], for one).
//!
//! Uses the sandbox core ([`crate::sandboxes`]) and what its shared state
//! holds or answers: the machine's isolation mode ([`crate::machine`]),
//! the rate limiter ([`crate::network`]), disks and records
//! ([`crate::storage`]), the budgets ([`crate::trees`]) and the fault
//! rules ([`crate::faults`]). Never a face or the server.

pub mod early_answer;
pub mod error;
pub mod files;
pub mod input;
pub mod limits;
pub mod middleware;
pub mod router;
pub mod state;
