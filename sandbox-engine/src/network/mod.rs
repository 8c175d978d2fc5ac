//! The engine's network: the HTTP/1.1 accept loop with its connection
//! cap and timeouts ([`connections`]), what every accept loop does when
//! `accept` fails ([`accept`]), the optional request rate limit
//! ([`rate_limit`]) and each sandbox's outbound proxy by policy
//! ([`egress`]).
//!
//! Uses [`crate::trees`] (the descriptor headroom and reserves) and
//! nothing above it: the machine starts a sandbox's proxy, the server
//! starts the listeners.

pub(crate) mod accept;
pub(crate) mod connections;
pub mod egress;
pub mod rate_limit;
