//! The network side: the transport trait and the real client, the
//! wasi-http hook, the policy guard (allowed origins, secret headers,
//! limits), the operator's secret rules, and the shared request pacer.

pub(crate) mod body;
pub(crate) mod client;
pub(crate) mod http_hook;
pub(crate) mod policy;
pub(crate) mod request_pacer;
pub(crate) mod secrets;
pub(crate) mod transport;
