//! Choosing the lease store from a URL: `postgres://…` (or
//! `postgresql://…`) for a PostgreSQL database several hosts share, a file
//! path or `sqlite://PATH` for the embedded SQLite store of one machine.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Result};

use crate::leases::backend::LeaseStore;
use crate::leases::postgres::PostgresLeases;
use crate::leases::sqlite::SqliteLeases;

/// Where the leases are kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreUrl {
    /// An SQLite file on this machine.
    Sqlite(PathBuf),
    /// A PostgreSQL database (the URL as given, with any password).
    Postgres(String),
}

impl StoreUrl {
    /// Reads a store URL: `postgres://…`, `postgresql://…`, `sqlite://PATH`,
    /// or a plain file path. Any other `scheme://` is refused.
    pub fn parse(text: &str) -> Result<StoreUrl> {
        let text = text.trim();
        if text.is_empty() {
            bail!(
                "the lease store URL is empty: pass postgres://USER@HOST/DATABASE or a file path"
            );
        }
        if text.starts_with("postgres://") || text.starts_with("postgresql://") {
            return Ok(StoreUrl::Postgres(text.to_owned()));
        }
        if let Some(path) = text.strip_prefix("sqlite://") {
            if path.is_empty() {
                bail!("the lease store URL sqlite:// names no file: pass sqlite:///PATH/leases.sqlite");
            }
            return Ok(StoreUrl::Sqlite(PathBuf::from(path)));
        }
        if let Some((scheme, _)) = text.split_once("://") {
            bail!(
                "the lease store URL scheme {scheme:?} is not supported: use postgres://USER@HOST/DATABASE \
                 for a shared store, or a file path (sqlite://PATH) for this machine's store"
            );
        }
        Ok(StoreUrl::Sqlite(PathBuf::from(text)))
    }

    /// Opens the store (for PostgreSQL: connects and applies the schema
    /// migrations; a wrong URL, an unreachable database or a newer schema
    /// fail here, before any lease is written).
    pub fn open(&self) -> Result<Arc<dyn LeaseStore>> {
        Ok(match self {
            StoreUrl::Sqlite(path) => Arc::new(SqliteLeases::open(path)?),
            StoreUrl::Postgres(url) => Arc::new(PostgresLeases::open(url)?),
        })
    }
}

/// Parses and opens the store at `text` (see [`StoreUrl::parse`]).
pub fn open_store(text: &str) -> Result<Arc<dyn LeaseStore>> {
    StoreUrl::parse(text)?.open()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_choose_the_backend_and_unknown_schemes_are_refused() {
        assert_eq!(
            StoreUrl::parse("postgres://u@h/db").unwrap(),
            StoreUrl::Postgres("postgres://u@h/db".into())
        );
        assert_eq!(
            StoreUrl::parse("/tmp/x.sqlite").unwrap(),
            StoreUrl::Sqlite("/tmp/x.sqlite".into())
        );
        assert_eq!(
            StoreUrl::parse("sqlite:///tmp/x.sqlite").unwrap(),
            StoreUrl::Sqlite("/tmp/x.sqlite".into())
        );
        let message = StoreUrl::parse("mysql://h/db").unwrap_err().to_string();
        assert!(message.contains("not supported"), "{message}");
        assert!(StoreUrl::parse("  ").is_err());
    }
}
