//! Issue 43 item 3, forks and templates: a paused sandbox's files copied
//! into a new sandbox (owners inside kept), or kept under a name that
//! later sandboxes start from; a template deleted leaves its sandboxes
//! alone; a running sandbox is never copied.

mod common;

use common::Harness;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

/// Files a setup command leaves in a sandbox: a file, one owned by uid
/// 1001 inside (where the sandbox's root owns a range of ids), a link.
const SETUP: &str =
    "mkdir -p /paperclip-workspace/app && echo set up > /paperclip-workspace/app/ready.txt && \
     echo secret > /root/notes && ln -s ready.txt /paperclip-workspace/app/link && \
     echo theirs > /paperclip-workspace/app/theirs.txt && \
     (chown 1001:1001 /paperclip-workspace/app/theirs.txt 2>/dev/null || true)";

/// What a sandbox holds of [`SETUP`], as one line per file.
const LOOK: &str =
    "cat /paperclip-workspace/app/ready.txt /root/notes /paperclip-workspace/app/link; \
     stat -c '%u:%g %n' /paperclip-workspace/app/theirs.txt";

async fn created(h: &Harness, body: Value) -> String {
    let (st, v) = h.post("/v1/sandboxes", body).await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    let id = v["data"]["id"].as_str().expect("id").to_string();
    h.wait_status(&id, "running").await;
    id
}

/// `POST /v1/templates` of sandbox `sb` as `name`.
async fn capture(h: &Harness, name: &str, sb: &str) -> (StatusCode, Value) {
    h.post("/v1/templates", json!({ "name": name, "sandbox_id": sb }))
        .await
}

async fn pause(h: &Harness, sb: &str) {
    let (st, v) = h
        .post(&format!("/v1/sandboxes/{sb}/pause"), json!({}))
        .await;
    assert!(st.is_success(), "{v}");
    h.wait_status(sb, "paused").await;
}

#[tokio::test]
async fn a_paused_sandbox_forks_and_becomes_a_template() {
    let h = Harness::start().await;
    let setup = created(
        &h,
        json!({ "shape": "s-1vcpu-1gb", "env": { "ROLE": "setup" } }),
    )
    .await;
    let r = h.exec(&setup, SETUP).await;
    assert_eq!(r["exit_code"], 0, "{r}");
    let seen = h.exec(&setup, LOOK).await["stdout"].clone();
    let owner_kept = seen.as_str().is_some_and(|s| s.contains("1001:1001"));
    // Running: no fork, no template.
    let (st, v) = h
        .post(&format!("/v1/sandboxes/{setup}/fork"), json!({}))
        .await;
    assert_eq!(st, StatusCode::CONFLICT, "{v}");
    let (st, v) = capture(&h, "app", &setup).await;
    assert_eq!(st, StatusCode::CONFLICT, "{v}");
    pause(&h, &setup).await;
    // A fork sees the files, as they were inside (owners included).
    let (st, v) = h
        .post(&format!("/v1/sandboxes/{setup}/fork"), json!({}))
        .await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    let fork = v["data"]["id"].as_str().expect("id").to_string();
    assert_ne!(fork, setup);
    h.wait_status(&fork, "running").await;
    // The fork runs under ids of its own, never its source's.
    {
        use std::os::unix::fs::MetadataExt;
        let owner = |sb: &str| {
            std::fs::metadata(h.server.data_dir().join(sb))
                .expect("root")
                .uid()
        };
        if owner_kept {
            assert_ne!(
                owner(&fork),
                owner(&setup),
                "the fork has a range of its own"
            );
        }
    }
    let r = h.exec(&fork, &format!("{LOOK}; echo $ROLE")).await;
    assert_eq!(
        r["stdout"],
        format!("{}setup\n", seen.as_str().unwrap_or_default()),
        "{r}"
    );
    if owner_kept {
        // The fork's root owns that file's uid as its own 1001: it may
        // hand it back to itself.
        let r = h
            .exec(
                &fork,
                "chown 0:0 /paperclip-workspace/app/theirs.txt && echo mine",
            )
            .await;
        assert_eq!(r["stdout"], "mine\n", "{r}");
    }
    // A write in the fork leaves the source alone.
    h.exec(&fork, "echo changed > /paperclip-workspace/app/ready.txt")
        .await;
    // A template of the paused setup sandbox.
    let (st, v) = capture(&h, "app", &setup).await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    let (st, v) = capture(&h, "app", &setup).await;
    assert_eq!(st, StatusCode::CONFLICT, "a name in use: {v}");
    let (_, v) = h.get("/v1/templates").await;
    assert_eq!(v["data"][0]["name"], "app", "{v}");
    let from = created(&h, json!({ "shape": "s-1vcpu-1gb", "template": "app" })).await;
    let r = h.exec(&from, LOOK).await;
    assert_eq!(r["stdout"], seen, "{r}");
    // Deleting the template leaves the sandbox made from it alone.
    let (st, v) = h.req(Method::DELETE, "/v1/templates/app", None).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let r = h
        .exec(&from, "cat /paperclip-workspace/app/ready.txt")
        .await;
    assert_eq!(r["stdout"], "set up\n", "{r}");
    let (st, v) = h.req(Method::DELETE, "/v1/templates/app", None).await;
    assert_eq!(st, StatusCode::NOT_FOUND, "{v}");
    let (st, v) = h
        .post(
            "/v1/sandboxes",
            json!({ "shape": "s-1vcpu-1gb", "template": "app" }),
        )
        .await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{v}");
    // Bad names.
    for bad in ["", ".hidden", "a/b", "x".repeat(65).as_str()] {
        let (st, v) = capture(&h, bad, &setup).await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{bad:?}: {v}");
    }
    // The source still has its own files, resumed.
    let (st, v) = h
        .post(&format!("/v1/sandboxes/{setup}/resume"), json!({}))
        .await;
    assert!(st.is_success(), "{v}");
    h.wait_status(&setup, "running").await;
    let r = h
        .exec(&setup, "cat /paperclip-workspace/app/ready.txt")
        .await;
    assert_eq!(r["stdout"], "set up\n", "{r}");
    for sb in [&setup, &fork, &from] {
        let (st, v) = h.delete(&format!("/v1/sandboxes/{sb}")).await;
        assert_eq!(st, StatusCode::OK, "{v}");
    }
    assert!(h.server.shutdown().await.all_exited());
}

#[tokio::test]
async fn a_stopped_daytona_sandbox_becomes_a_snapshot_others_start_from() {
    let h = Harness::start().await;
    let setup = h.daytona_sandbox().await;
    let (_, v) = h
        .daytona_execute(
            &setup,
            &format!("bash -c '{}'", SETUP.replace('\'', "'\\''")),
        )
        .await;
    assert_eq!(v["exitCode"], 0, "{v}");
    let api = h.server.daytona_api_url();
    let snapshot = || {
        h.daytona(
            Method::POST,
            format!("{api}/sandbox/{setup}/snapshot"),
            Some(json!({ "name": "daytona-app" })),
        )
    };
    let (st, v) = snapshot().await;
    assert_eq!(st, StatusCode::CONFLICT, "a started sandbox: {v}");
    let (st, v) = h
        .daytona(Method::POST, format!("{api}/sandbox/{setup}/stop"), None)
        .await;
    assert!(st.is_success(), "{v}");
    let (st, v) = snapshot().await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let (st, v) = h
        .daytona_create(json!({ "snapshot": "daytona-app", "autoStopInterval": 0 }))
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let made = v["id"].as_str().expect("id").to_string();
    let (_, v) = h
        .daytona_execute(&made, "cat /paperclip-workspace/app/ready.txt")
        .await;
    assert_eq!(v["result"], "set up\n", "{v}");
    let (st, v) = h
        .daytona(Method::DELETE, format!("{api}/snapshots/daytona-app"), None)
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let (_, v) = h
        .daytona_execute(&made, "cat /paperclip-workspace/app/ready.txt")
        .await;
    assert_eq!(v["result"], "set up\n", "kept after the snapshot went: {v}");
    for sb in [&setup, &made] {
        let (st, v) = h.daytona_delete(sb).await;
        assert!(st.is_success(), "{v}");
    }
    assert!(h.server.shutdown().await.all_exited());
}

/// `GET /snapshots` as Daytona's: a page `{items, total, page,
/// totalPages}` of the snapshots this engine took (`page`, `limit`, a
/// partial `name`, `sort` and `order`), each `active` with its name,
/// times and size; a bad query value is a 400 in the face's error body.
/// `GET /snapshots/{id}` answers one.
#[tokio::test]
async fn the_daytona_face_lists_the_snapshots_it_took_a_page_at_a_time() {
    let h = Harness::start().await;
    let api = h.server.daytona_api_url();
    let list = |query: &str| h.daytona(Method::GET, format!("{api}/snapshots{query}"), None);
    let (st, v) = list("").await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(
        v,
        json!({ "items": [], "total": 0, "page": 1, "totalPages": 0 }),
        "nothing taken yet"
    );
    let setup = h.daytona_sandbox().await;
    let (_, v) = h
        .daytona_execute(&setup, "bash -c 'echo set up > /tmp/ready.txt'")
        .await;
    assert_eq!(v["exitCode"], 0, "{v}");
    let (st, v) = h
        .daytona(Method::POST, format!("{api}/sandbox/{setup}/stop"), None)
        .await;
    assert!(st.is_success(), "{v}");
    // Taken in an order that is not the names' order: the list's
    // `createdAt` is when each was taken (not the sandbox's files' time).
    for name in ["list-b", "list-a", "other-c"] {
        let (st, v) = h
            .daytona(
                Method::POST,
                format!("{api}/sandbox/{setup}/snapshot"),
                Some(json!({ "name": name })),
            )
            .await;
        assert_eq!(st, StatusCode::OK, "{name}: {v}");
    }
    let names = |v: &Value| -> Vec<String> {
        v["items"]
            .as_array()
            .map(|items| {
                items
                    .iter()
                    .filter_map(|i| i["name"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };

    let (st, v) = list("?sort=createdAt&order=asc").await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(names(&v), ["list-b", "list-a", "other-c"], "{v}");
    assert_eq!(
        (v["total"].clone(), v["page"].clone()),
        (json!(3), json!(1))
    );
    assert_eq!(v["totalPages"], 1, "{v}");
    let item = &v["items"][0];
    assert_eq!(item["state"], "active", "{item}");
    assert_eq!(item["general"], false, "{item}");
    for field in ["id", "createdAt", "updatedAt"] {
        assert!(
            item[field].as_str().is_some_and(|s| !s.is_empty()),
            "{field}: {item}"
        );
    }
    assert!(item["size"].is_number(), "{item}");

    let (_, v) = list("?sort=createdAt&order=desc").await;
    assert_eq!(names(&v), ["other-c", "list-a", "list-b"], "{v}");
    let (_, v) = list("?sort=name&order=asc&limit=2&page=2").await;
    assert_eq!(names(&v), ["other-c"], "{v}");
    assert_eq!(
        (
            v["total"].clone(),
            v["page"].clone(),
            v["totalPages"].clone()
        ),
        (json!(3), json!(2), json!(2)),
        "{v}"
    );
    let (_, v) = list("?sort=name&order=asc&limit=2").await;
    assert_eq!(names(&v), ["list-a", "list-b"], "{v}");
    let (_, v) = list("?page=9").await;
    assert_eq!(names(&v), Vec::<String>::new(), "past the last page: {v}");
    let (_, v) = list("?name=LIST&sort=name").await;
    assert_eq!(names(&v), ["list-b", "list-a"], "partial name, desc: {v}");

    for bad in [
        "?limit=0",
        "?limit=201",
        "?limit=ten",
        "?page=0",
        "?page=-1",
        "?page=1.5",
        "?sort=size",
        "?order=up",
        "?sourceSandboxId=x",
    ] {
        let (st, v) = list(bad).await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{bad}: {v}");
        assert_eq!(v["statusCode"], 400, "{bad}: {v}");
        assert!(
            v["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{bad}: {v}"
        );
    }

    // One snapshot by its id or name (the service's `GET /snapshots/{id}`,
    // which its SDK resolves a name through before a delete).
    let (st, v) = h
        .daytona(Method::GET, format!("{api}/snapshots/list-a"), None)
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(
        (v["name"].clone(), v["state"].clone()),
        (json!("list-a"), json!("active"))
    );
    let id = v["id"].as_str().expect("an id").to_string();
    assert!(
        id.len() == 36 && id.split('-').count() == 5,
        "a UUID, as the service's, not the name: {id}"
    );
    let (st, v) = h
        .daytona(Method::GET, format!("{api}/snapshots/{id}"), None)
        .await;
    assert_eq!(
        (st, v["name"].clone()),
        (StatusCode::OK, json!("list-a")),
        "{v}"
    );
    let (st, v) = h
        .daytona(Method::GET, format!("{api}/snapshots/never-taken"), None)
        .await;
    assert_eq!(st, StatusCode::NOT_FOUND, "{v}");
    assert_eq!(v["statusCode"], 404, "{v}");

    // A deleted snapshot is no longer listed.
    let (st, v) = h
        .daytona(Method::DELETE, format!("{api}/snapshots/list-b"), None)
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let (_, v) = list("?sort=createdAt&order=asc").await;
    assert_eq!(names(&v), ["list-a", "other-c"], "{v}");
    // By its id, as the service's delete takes it.
    let (st, v) = h
        .daytona(Method::DELETE, format!("{api}/snapshots/{id}"), None)
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let (_, v) = list("").await;
    assert_eq!(names(&v), ["other-c"], "{v}");
    let (st, _) = h
        .daytona(Method::DELETE, format!("{api}/snapshots/{id}"), None)
        .await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    let (st, v) = h.daytona_delete(&setup).await;
    assert!(st.is_success(), "{v}");
    assert!(h.server.shutdown().await.all_exited());
}
