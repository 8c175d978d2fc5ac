//! Test doubles shared by every test (feature `testing`): a scripted
//! transport that records requests.

pub mod scripted;
