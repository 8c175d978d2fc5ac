//! Test doubles shared by every test (feature `testing`): a scripted
//! transport that records requests, and a throwaway PostgreSQL cluster for
//! the PostgreSQL lease store.

pub mod postgres;
pub mod scripted;
