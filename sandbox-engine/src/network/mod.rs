//! The engine's network: the HTTP/1.1 accept loop with its connection
//! cap and timeouts ([`connections`]), what every accept loop does when
//! `accept` fails ([`accept`]), the optional request rate limit
//! ([`rate_limit`]), each sandbox's outbound proxy by policy
//! ([`egress`]), the way into a sandbox's ports ([`ingress`]), and the
//! request head both relays read first ([`head`]).
//!
//! Uses [`crate::trees`] (the descriptor headroom and reserves),
//! [`crate::util`] (tokens) and nothing above it: the machine starts a sandbox's proxy, the server
//! starts the listeners.

pub(crate) mod accept;
pub(crate) mod connections;
pub mod egress;
pub(crate) mod head;
pub mod ingress;
pub mod rate_limit;
