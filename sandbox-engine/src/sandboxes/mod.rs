//! The sandbox core both faces share: the store of sandboxes and their
//! processes ([`store`]), the supervisor that starts each managed process,
//! journals its output and proves its tree gone ([`supervisor`]), the
//! engine-wide budget of kept output ([`output_budget`]), proving a whole
//! sandbox gone ([`teardown`]) and what the Daytona face knows beyond the
//! core ([`daytona_registry`]).
//!
//! Uses [`crate::machine`], [`crate::network`] (a sandbox's egress in
//! its answer), [`crate::storage`], [`crate::trees`] and
//! [`crate::util`]; never the HTTP layer, the faces or the server, which
//! use it.

pub(crate) mod daytona_registry;
pub mod output_budget;
pub(crate) mod store;
pub(crate) mod supervisor;
pub mod teardown;
