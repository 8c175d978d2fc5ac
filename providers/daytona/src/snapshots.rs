//! Daytona snapshots as the contract's templates (capability
//! `templates`): a template's reference is the snapshot's name
//! ([`provider_sdk::templates::reference`]), and `list-templates` reads
//! `GET /snapshots` a page at a time: `{items, total, page, totalPages}`,
//! asked for the context's scope (`name` matches part of a name), oldest
//! first. Whatever the answer holds beyond the scope's snapshots is left
//! out; an answer of another shape is `invalid-response`.

use provider_sdk::errors::{encode_query_value, ApiError};
use provider_sdk::templates;
use provider_sdk::types::{EnvironmentContext, TemplateInfo};
use serde_json::Value;

/// Snapshots asked for per page (the service's default page).
pub const PAGE_SIZE: u64 = 100;

/// Most pages one listing follows: far beyond what one environment keeps,
/// so that a server whose pages never end cannot hold a call forever.
pub const MAX_PAGES: u64 = 100;

/// `GET` path of page `page` (from 1) of the snapshots whose names hold
/// `scope`, oldest first.
pub fn page_path(scope: &str, page: u64) -> String {
    format!(
        "/snapshots?page={page}&limit={PAGE_SIZE}&name={}&sort=createdAt&order=asc",
        encode_query_value(scope)
    )
}

/// One page of the listing: the context's templates on it, and whether a
/// later page remains.
#[derive(Debug)]
pub struct Page {
    /// The templates of the context's scope on this page, in its order.
    pub templates: Vec<TemplateInfo>,
    /// Whether the answer says there is a page after this one.
    pub more: bool,
}

/// Reads the answer to page `page`: every item must be an object with a
/// string `name`, and `totalPages` a whole number.
pub fn read_page(ctx: &EnvironmentContext, page: u64, answer: Value) -> Result<Page, ApiError> {
    let bad = |why: &str| ApiError::Invalid(format!("the snapshot list {why}"));
    let Value::Object(answer) = answer else {
        return Err(bad("is not a JSON object"));
    };
    let Some(Value::Array(items)) = answer.get("items") else {
        return Err(bad("has no items array"));
    };
    let total_pages = answer
        .get("totalPages")
        .and_then(Value::as_u64)
        .ok_or_else(|| bad("has no whole number totalPages"))?;
    let mut found = Vec::new();
    for item in items {
        let Some(service_name) = item.get("name").and_then(Value::as_str) else {
            return Err(bad("holds a snapshot without a name"));
        };
        if let Some(name) = templates::listed_name(ctx, service_name) {
            found.push(TemplateInfo {
                name: name.into(),
                template_ref: service_name.into(),
                created_at: item
                    .get("createdAt")
                    .and_then(Value::as_str)
                    .map(str::to_string),
            });
        }
    }
    Ok(Page {
        templates: found,
        more: !items.is_empty() && page < total_pages,
    })
}

/// Adds a page's templates to those of the pages before, each once (a
/// list that moved between pages may show one twice). The order stays
/// the service's (`sort=createdAt&order=asc`): sorting here would cost the
/// component a sort routine (about 10 KB) for services that honour it.
pub fn add_page(listed: &mut Vec<TemplateInfo>, page: Vec<TemplateInfo>) {
    for template in page {
        if !listed
            .iter()
            .any(|t| t.template_ref == template.template_ref)
        {
            listed.push(template);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use provider_sdk::testing::context;
    use serde_json::json;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn a_page_keeps_the_scope_s_snapshots_and_says_whether_more_follow() {
        let ctx = context("{}");
        let mine = templates::reference(&ctx, "setup").unwrap();
        let answer = json!({
            "items": [
                { "name": mine, "createdAt": "2026-12-07T10:00:00.000Z", "state": "active" },
                { "name": "0123456789abcdef.theirs" },
                { "name": "daytonaio/sandbox:0.4.3" },
            ],
            "total": 5, "page": 1, "totalPages": 2,
        });
        let page = read_page(&ctx, 1, answer.clone()).unwrap();
        let seen: Vec<_> = page
            .templates
            .iter()
            .map(|t| {
                (
                    t.name.as_str(),
                    t.template_ref.as_str(),
                    t.created_at.as_deref(),
                )
            })
            .collect();
        assert_eq!(
            seen,
            [("setup", mine.as_str(), Some("2026-12-07T10:00:00.000Z"))]
        );
        assert!(page.more);
        assert!(!read_page(&ctx, 2, answer).unwrap().more, "the last page");
        let empty = json!({ "items": [], "total": 9, "page": 3, "totalPages": 9 });
        assert!(
            !read_page(&ctx, 3, empty).unwrap().more,
            "an empty page ends it"
        );
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn an_answer_of_another_shape_is_invalid() {
        let ctx = context("{}");
        for answer in [
            json!([]),
            json!({ "totalPages": 1 }),
            json!({ "items": {}, "totalPages": 1 }),
            json!({ "items": [] }),
            json!({ "items": [], "totalPages": -1 }),
            json!({ "items": [], "totalPages": "1" }),
            json!({ "items": [{ "id": "x" }], "totalPages": 1 }),
            json!({ "items": ["name"], "totalPages": 1 }),
            json!({ "items": [{ "name": 7 }], "totalPages": 1 }),
        ] {
            assert!(
                matches!(
                    read_page(&ctx, 1, answer.clone()),
                    Err(ApiError::Invalid(_))
                ),
                "{answer}"
            );
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn the_pages_make_one_list_each_template_once() {
        let info = |r: &str| TemplateInfo {
            name: r.into(),
            template_ref: r.into(),
            created_at: None,
        };
        let mut listed = Vec::new();
        add_page(&mut listed, vec![info("a"), info("b")]);
        add_page(&mut listed, vec![info("b"), info("c")]);
        let refs: Vec<&str> = listed.iter().map(|t| t.template_ref.as_str()).collect();
        assert_eq!(refs, ["a", "b", "c"]);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_page_is_asked_for_the_scope_oldest_first() {
        assert_eq!(
            page_path("00ff", 3),
            "/snapshots?page=3&limit=100&name=00ff&sort=createdAt&order=asc"
        );
    }
}
