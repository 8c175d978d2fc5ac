//! Issue 38 item 5: a CreateOS sandbox created with `expires_at` has a
//! hard expiry the engine attests in its answer and keeps: by then the
//! sandbox is deleted with proof (its processes gone, its disk gone, its id
//! answering 404), whatever still runs in it. A time that is not RFC 3339
//! or not in the future is refused with nothing created.

#[path = "common/binary.rs"]
mod binary;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use binary::{disk_remains, live_of_uid, owner, Engine};
use serde_json::json;

/// The RFC 3339 text of `secs` seconds from now (what Paperclip sends:
/// `Date.toISOString()`, milliseconds and `Z`).
fn in_seconds(secs: u64) -> String {
    let at = SystemTime::now().duration_since(UNIX_EPOCH).unwrap() + Duration::from_secs(secs);
    let text = sandbox_engine_time(at.as_secs());
    format!("{}.{:03}Z", &text[..19], at.subsec_millis())
}

/// Seconds since the epoch as `YYYY-MM-DDTHH:MM:SS` (by `date`, so the
/// test does not reuse the engine's own formatter).
fn sandbox_engine_time(secs: u64) -> String {
    let out = std::process::Command::new("date")
        .args(["-u", "-d", &format!("@{secs}"), "+%Y-%m-%dT%H:%M:%S"])
        .output()
        .expect("date runs");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

#[tokio::test]
async fn a_sandbox_is_deleted_with_proof_by_its_expiry() {
    let engine = Engine::start("expiry", &[], None);
    let asked = in_seconds(8);
    let (st, v) = engine
        .call(
            reqwest::Method::POST,
            "/v1/sandboxes",
            Some(json!({"shape": "s-1vcpu-256mb", "expires_at": asked})),
        )
        .await;
    assert_eq!(st, 201, "{v}");
    let sb = v["data"]["id"].as_str().unwrap().to_string();
    let kept = v["data"]["expires_at"]
        .as_str()
        .expect("the expiry is attested")
        .to_string();
    assert_eq!(
        &kept[..19],
        &asked[..19],
        "the expiry asked, in whole seconds"
    );
    assert!(kept <= asked, "never later than asked: {kept} > {asked}");
    loop {
        let (_, got) = engine
            .call(reqwest::Method::GET, &format!("/v1/sandboxes/{sb}"), None)
            .await;
        assert_eq!(got["data"]["expires_at"], kept.as_str());
        if got["data"]["status"] == "running" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Something that would run far past the expiry.
    engine.spawn(&sb, "sleep 600").await;
    let uid = owner(&engine.root(&sb)).expect("the sandbox root");
    assert!(!live_of_uid(uid).is_empty(), "the sandbox runs");

    let expiry = SystemTime::UNIX_EPOCH
        + Duration::from_secs(
            u64::try_from(
                std::process::Command::new("date")
                    .args(["-u", "-d", &kept, "+%s"])
                    .output()
                    .map(|o| {
                        String::from_utf8(o.stdout)
                            .unwrap()
                            .trim()
                            .parse::<i64>()
                            .unwrap()
                    })
                    .unwrap(),
            )
            .unwrap(),
        );
    // Polled until a little after the expiry: the answer is the proof.
    loop {
        let (st, v) = engine
            .call(reqwest::Method::GET, &format!("/v1/sandboxes/{sb}"), None)
            .await;
        if st == 404 {
            break;
        }
        assert_eq!(st, 200, "{v}");
        assert!(
            SystemTime::now() < expiry + Duration::from_secs(10),
            "the sandbox still exists after its expiry: {v}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(live_of_uid(uid).is_empty(), "its processes are gone");
    assert!(
        disk_remains(&engine.data, &sb).is_empty(),
        "its disk is gone"
    );
    let (ok, stderr) = engine.stop();
    assert!(ok, "{stderr}");
}

#[tokio::test]
async fn an_expiry_that_is_not_a_future_rfc3339_time_is_refused_with_nothing_created() {
    let engine = Engine::start("expiry-refused", &[], None);
    for bad in [
        json!("tomorrow"),
        json!("2020-01-01T00:00:00Z"),
        json!(in_seconds(1)),
        json!(12),
    ] {
        let (st, v) = engine
            .call(
                reqwest::Method::POST,
                "/v1/sandboxes",
                Some(json!({"shape": "s-1vcpu-256mb", "expires_at": bad})),
            )
            .await;
        assert_eq!(st, 400, "{bad}: {v}");
    }
    let roots: Vec<String> = std::fs::read_dir(&engine.data)
        .expect("the data directory")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| name.starts_with("sb-"))
        .collect();
    assert!(roots.is_empty(), "no sandbox was created: {roots:?}");
    let (ok, stderr) = engine.stop();
    assert!(ok, "{stderr}");
}
