//! The Daytona face's snapshots: `GET /snapshots` (a page of those this
//! engine took), `GET /snapshots/{id}` and `DELETE /snapshots/{id}`. A
//! snapshot is taken by `POST /sandbox/{id}/snapshot`
//! ([`super::sandboxes::snapshot`]) into the engine's template store
//! ([`crate::storage::templates`]), the same store the CreateOS face's
//! templates live in; the engine has one API key, so every snapshot in it
//! is the key's own (organization `local`).
//!
//! As on the service, a snapshot's `id` is not its name: a UUID derived
//! from the name and the time it was taken ([`snapshot_id`]), so that a
//! client that deletes by name where the service wants an id fails here
//! as it would there. `GET` and `DELETE` take either.

use std::cmp::Ordering;
use std::time::SystemTime;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::error::DaytonaError;
use crate::http::state::Shared;

/// Page size when `limit` is not given (the service's default).
const DEFAULT_LIMIT: u64 = 100;

/// Largest page `limit` may ask for (the service's maximum).
const MAX_LIMIT: u64 = 200;

/// `?page=&limit=&name=&sort=&order=` of `GET /snapshots`, as given: each
/// is checked by [`ListRequest::parse`] so that a bad one is a 400 that
/// names it.
#[derive(Debug, Deserialize)]
pub struct ListQuery {
    page: Option<String>,
    limit: Option<String>,
    name: Option<String>,
    sort: Option<String>,
    order: Option<String>,
    /// The service's filter by the sandbox a snapshot was taken from,
    /// which this engine does not record: refused, never ignored.
    #[serde(rename = "sourceSandboxId")]
    source_sandbox_id: Option<String>,
}

/// What a snapshot list is sorted by (the service's `sort` values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SortField {
    Name,
    State,
    LastUsedAt,
    CreatedAt,
}

/// A checked `GET /snapshots` query.
#[derive(Debug)]
struct ListRequest {
    page: u64,
    limit: u64,
    name: Option<String>,
    sort: SortField,
    descending: bool,
}

impl ListRequest {
    fn parse(q: ListQuery) -> Result<Self, DaytonaError> {
        if q.source_sandbox_id.is_some() {
            return Err(DaytonaError::bad_request(
                "sourceSandboxId is not served here: this engine does not record which sandbox \
                 a snapshot was taken from (list without it)",
            ));
        }
        let page = whole_number("page", q.page.as_deref(), 1, u64::MAX)?.unwrap_or(1);
        let limit =
            whole_number("limit", q.limit.as_deref(), 1, MAX_LIMIT)?.unwrap_or(DEFAULT_LIMIT);
        let sort = match q.sort.as_deref() {
            None | Some("lastUsedAt") => SortField::LastUsedAt,
            Some("name") => SortField::Name,
            Some("state") => SortField::State,
            Some("createdAt") => SortField::CreatedAt,
            Some(other) => {
                return Err(DaytonaError::bad_request(format!(
                    "sort must be one of name, state, lastUsedAt, createdAt (got {other:?})"
                )))
            }
        };
        let descending = match q.order.as_deref() {
            None | Some("desc") => true,
            Some("asc") => false,
            Some(other) => {
                return Err(DaytonaError::bad_request(format!(
                    "order must be asc or desc (got {other:?})"
                )))
            }
        };
        Ok(Self {
            page,
            limit,
            name: q.name.filter(|n| !n.is_empty()),
            sort,
            descending,
        })
    }
}

/// A query value that must be a whole number from `min` to `max`;
/// `None` when absent.
fn whole_number(
    field: &str,
    text: Option<&str>,
    min: u64,
    max: u64,
) -> Result<Option<u64>, DaytonaError> {
    let Some(text) = text else { return Ok(None) };
    match text.parse::<u64>() {
        Ok(n) if (min..=max).contains(&n) => Ok(Some(n)),
        _ if max == u64::MAX => Err(DaytonaError::bad_request(format!(
            "{field} must be a whole number of at least {min} (got {text:?})"
        ))),
        _ => Err(DaytonaError::bad_request(format!(
            "{field} must be a whole number from {min} to {max} (got {text:?})"
        ))),
    }
}

/// One kept snapshot as the list sees it.
struct Kept {
    name: String,
    created: SystemTime,
    bytes: u64,
}

/// The snapshots kept, oldest first.
async fn kept(state: &Shared) -> Result<Vec<Kept>, DaytonaError> {
    let data_dir = state.data_dir.clone();
    let kept =
        crate::http::state::blocking(state, move || crate::storage::templates::list(&data_dir))
            .await?;
    Ok(kept
        .into_iter()
        .map(|(name, created, bytes)| Kept {
            name,
            created,
            bytes,
        })
        .collect())
}

/// The kept snapshot whose id or name is `id_or_name`; 404 otherwise.
async fn find(state: &Shared, id_or_name: &str) -> Result<Kept, DaytonaError> {
    kept(state)
        .await?
        .into_iter()
        .find(|k| k.name == id_or_name || k.id() == id_or_name)
        .ok_or_else(|| DaytonaError::not_found("snapshot"))
}

/// The id of snapshot `name` taken at `created`: UUID-shaped (version 4
/// bits), from two SipHash-1-3 digests with fixed keys, so the same
/// snapshot has the same id for as long as it is kept (and across restarts
/// of the same build), and a snapshot taken again under the name gets
/// another.
pub fn snapshot_id(name: &str, created: SystemTime) -> String {
    use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
    let at = created
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let digest =
        |part: u8| BuildHasherDefault::<DefaultHasher>::default().hash_one((part, name, at));
    let bits = (u128::from(digest(1)) << 64) | u128::from(digest(2));
    let bits = (bits & !(0xf << 76) | (0x4 << 76)) & !(0x3 << 62) | (0x2 << 62);
    let hex = format!("{bits:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

impl Kept {
    fn id(&self) -> String {
        snapshot_id(&self.name, self.created)
    }

    fn cmp_by(&self, other: &Self, field: SortField) -> Ordering {
        match field {
            SortField::Name => self.name.cmp(&other.name),
            // Every listed snapshot is `active`, and this engine records
            // no use: both order as `createdAt`.
            SortField::State | SortField::LastUsedAt | SortField::CreatedAt => self
                .created
                .cmp(&other.created)
                .then_with(|| self.name.cmp(&other.name)),
        }
    }

    /// The service's `SnapshotDto` fields for a snapshot of a sandbox's
    /// files: the resources are those a sandbox made from it gets, `size`
    /// is in GiB.
    fn to_json(&self) -> Value {
        let at = crate::util::rfc3339_of(self.created);
        json!({
            "id": self.id(),
            "organizationId": "local",
            "general": false,
            "name": self.name,
            "state": "active",
            "size": self.bytes as f64 / f64::from(1u32 << 30),
            "entrypoint": null,
            "cpu": 1,
            "gpu": 0,
            "mem": 1,
            "disk": 3,
            "errorReason": null,
            "createdAt": at,
            "updatedAt": at,
            "lastUsedAt": null,
        })
    }
}

/// `GET /snapshots`: one page `{items, total, page, totalPages}` of the
/// snapshots this engine took whose name contains `name` (any case),
/// sorted by `sort` (default `lastUsedAt`) in `order` (default `desc`);
/// a page past the last is empty. A bad `page`, `limit` (1–200), `sort`
/// or `order` is a 400 naming it.
pub async fn list(
    State(state): State<Shared>,
    Query(q): Query<ListQuery>,
) -> Result<Response, DaytonaError> {
    let wanted = ListRequest::parse(q)?;
    let needle = wanted.name.as_deref().map(str::to_lowercase);
    let mut kept: Vec<Kept> = kept(&state)
        .await?
        .into_iter()
        .filter(|k| {
            needle
                .as_deref()
                .is_none_or(|n| k.name.to_lowercase().contains(n))
        })
        .collect();
    kept.sort_by(|a, b| {
        let by = a.cmp_by(b, wanted.sort);
        if wanted.descending {
            by.reverse()
        } else {
            by
        }
    });
    let total = kept.len() as u64;
    let items: Vec<Value> = kept
        .iter()
        .skip(usize::try_from((wanted.page - 1).saturating_mul(wanted.limit)).unwrap_or(usize::MAX))
        .take(wanted.limit as usize)
        .map(Kept::to_json)
        .collect();
    Ok((
        StatusCode::OK,
        Json(json!({
            "items": items,
            "total": total,
            "page": wanted.page,
            "totalPages": total.div_ceil(wanted.limit),
        })),
    )
        .into_response())
}

/// `GET /snapshots/{id}`: one snapshot this engine took, by its id or
/// its name; 404 for any other.
pub async fn get_one(
    State(state): State<Shared>,
    Path(id): Path<String>,
) -> Result<Response, DaytonaError> {
    let kept = find(&state, &id).await?;
    Ok((StatusCode::OK, Json(kept.to_json())).into_response())
}

/// `DELETE /snapshots/{id}`: a snapshot this engine took, by its id or
/// its name; sandboxes made from it keep their files.
pub async fn delete(
    State(state): State<Shared>,
    Path(id): Path<String>,
) -> Result<Response, DaytonaError> {
    let name = find(&state, &id).await?.name;
    let (data_dir, n) = (state.data_dir.clone(), name.clone());
    let deleted = crate::http::state::blocking(&state, move || {
        crate::storage::templates::delete(&data_dir, &n)
    })
    .await?;
    match deleted {
        Ok(true) => Ok((StatusCode::OK, Json(json!({ "name": name }))).into_response()),
        Ok(false) => Err(DaytonaError::not_found("snapshot")),
        Err(e) => Err(crate::http::error::ApiError::internal(format!(
            "snapshot {name:?} could not be deleted: {e}"
        ))
        .into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn an_id_is_a_uuid_of_the_name_and_its_time() {
        let at = std::time::UNIX_EPOCH + Duration::from_nanos(1_765_000_000_123_456_789);
        let id = snapshot_id("a.setup", at);
        assert_eq!(id, snapshot_id("a.setup", at), "stable");
        assert_eq!(id.len(), 36);
        let parts: Vec<&str> = id.split('-').collect();
        assert_eq!(
            parts.iter().map(|p| p.len()).collect::<Vec<_>>(),
            [8, 4, 4, 4, 12]
        );
        assert!(parts[2].starts_with('4'), "{id}");
        assert!(matches!(&parts[3][..1], "8" | "9" | "a" | "b"), "{id}");
        assert_ne!(id, snapshot_id("a.setup2", at));
        assert_ne!(id, snapshot_id("a.setup", at + Duration::from_nanos(1)));
    }
}
