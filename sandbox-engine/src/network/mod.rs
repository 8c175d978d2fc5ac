//! The engine's network: the HTTP/1.1 accept loop with its connection
//! cap and timeouts ([`connections`]), what every accept loop does when
//! `accept` fails ([`accept`]), the optional request rate limit
//! ([`rate_limit`]), each sandbox's outbound proxy by policy
//! ([`egress`]) and the way into a sandbox's ports ([`ingress`]).
//!
//! Uses [`crate::trees`] (the descriptor headroom and reserves),
//! [`crate::util`] (tokens) and nothing above it: the machine starts a sandbox's proxy, the server
//! starts the listeners.

pub(crate) mod accept;
pub(crate) mod connections;
pub mod egress;
pub mod ingress;
pub mod rate_limit;
