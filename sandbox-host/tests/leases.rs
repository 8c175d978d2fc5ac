//! Lease fencing between hosts and operations: host liveness by heartbeat,
//! atomic marks, the `closing` state, and `expired` that is not "gone".

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use sandbox_host::types::{ExecuteRequest, ProviderError, ResumeOutcome};
use sandbox_host::{
    CancelToken, LeaseState, LeaseStore, Liveness, Operation, RequestPacer, SandboxRuntime,
    ScriptedResponse, ScriptedTransport, Secrets, SqliteLeases,
};

mod common;
use common::{short_liveness, test_provider};
use test_support::{acquire, RequestExt};

fn runtime(store: Arc<SqliteLeases>) -> SandboxRuntime {
    let script = ScriptedTransport::new(|_| ScriptedResponse::status(500));
    SandboxRuntime::new(test_provider().clone(), store, script.shared())
        .unwrap()
        .with_request_pacer(RequestPacer::in_memory())
}

fn store_file(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("sandbox-leases-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir.join("leases.sqlite")
}

fn command(name: &str) -> ExecuteRequest {
    test_support::command(name, &["hi"]).timeout_ms(10_000)
}

/// Pins issue 9 item 1 (pid reuse): liveness was `/proc/<pid>`, and a mark
/// with this process's own pid counted as alive, so a CLI that gets the
/// same pid on every start (pid 1 in a container) reused a lease whose
/// command may still run. Here both hosts share one pid: the dead one is
/// recognised by its expired heartbeat, and every operation refuses the
/// lease after poisoning it durably.
#[test]
fn a_mark_of_a_host_whose_heartbeat_expired_poisons_the_lease_even_with_the_same_pid() {
    let path = store_file("same-pid");
    let lease_id = {
        let store = Arc::new(SqliteLeases::open(&path).unwrap());
        let rt = runtime(store.clone());
        let env = rt.environment("co", "env", "{}", &Secrets::none()).unwrap();
        let record = rt.acquire(&env, &acquire("r1")).unwrap().unwrap();
        // A second host instance (same pid) takes the busy mark and dies.
        let mut dead = store.register_host(short_liveness()).unwrap();
        store
            .begin(&record.id, Operation::Execute, env.context(), dead.id())
            .unwrap();
        dead.stop_heartbeat_for_test();
        record.id
    };
    thread::sleep(short_liveness().expiry + Duration::from_millis(300));

    let rt = runtime(Arc::new(SqliteLeases::open(&path).unwrap()));
    let env = rt.environment("co", "env", "{}", &Secrets::none()).unwrap();
    let refused = rt
        .execute(&env, &lease_id, &command("echo"), None, CancelToken::new())
        .unwrap_err();
    let message = format!("{refused:#}");
    assert!(message.contains("died"), "{message}");
    assert!(message.contains("sandbox lease destroy"), "{message}");
    // Durably: a fresh store handle sees it.
    let record = SqliteLeases::open(&path)
        .unwrap()
        .get(&lease_id)
        .unwrap()
        .unwrap();
    assert_eq!(record.state, LeaseState::Poisoned);
    assert!(record.busy_owner.is_none());
    // Every other use is refused too; destroy clears it.
    assert!(rt.release(&env, &lease_id).is_err());
    assert!(rt.resume(&env, &lease_id).is_err());
    rt.destroy(&env, &lease_id).unwrap().unwrap();
    assert_eq!(
        rt.store().get(&lease_id).unwrap().unwrap().state,
        LeaseState::Destroyed
    );
}

/// Pins issue 9 item 1 (atomic marks): a second process could overwrite
/// (`mark_busy`) or clear (`clear_busy`) a live mark. Now a live host's
/// mark refuses other hosts, and only its owner can drop it.
#[test]
fn a_live_mark_can_be_neither_taken_nor_cleared_by_another_host() {
    let path = store_file("live");
    let store = Arc::new(SqliteLeases::open(&path).unwrap());
    let rt = runtime(store.clone());
    let env = rt.environment("co", "env", "{}", &Secrets::none()).unwrap();
    let record = rt.acquire(&env, &acquire("r2")).unwrap().unwrap();

    let other = store.register_host(Liveness::DEFAULT).unwrap();
    store
        .begin(&record.id, Operation::Execute, env.context(), other.id())
        .unwrap();

    let second = runtime(Arc::new(SqliteLeases::open(&path).unwrap()));
    for outcome in [
        second
            .execute(&env, &record.id, &command("echo"), None, CancelToken::new())
            .map(|_| ()),
        second.release(&env, &record.id).map(|_| ()),
        second.destroy(&env, &record.id).map(|_| ()),
    ] {
        let message = format!("{:#}", outcome.unwrap_err());
        assert!(message.contains("running an operation on it"), "{message}");
    }
    // Ending a use that is not yours leaves the mark alone.
    second
        .store()
        .end_use(&record.id, second.host_id())
        .unwrap();
    let stored = store.get(&record.id).unwrap().unwrap();
    assert_eq!(stored.busy_owner.as_deref(), Some(other.id()));
    assert_eq!(stored.state, LeaseState::Active);
    store.end_use(&record.id, other.id()).unwrap();
    second
        .execute(&env, &record.id, &command("echo"), None, CancelToken::new())
        .unwrap()
        .unwrap();
}

/// Pins issue 9 item 2: release cancelled running commands and only then
/// checked the lease, so an `execute` arriving meanwhile ran inside a
/// sandbox that release then paused. Release now moves the lease to
/// `closing` first, and execute refuses a closing lease.
#[test]
fn no_command_starts_while_a_release_is_under_way() {
    let rt = Arc::new(runtime(Arc::new(SqliteLeases::open_in_memory().unwrap())));
    let env = rt
        .environment("co", "env", r#"{"mode":"slow-release"}"#, &Secrets::none())
        .unwrap();
    let record = rt.acquire(&env, &acquire("r3")).unwrap().unwrap();
    let releasing = {
        let (rt, env, id) = (rt.clone(), env.clone(), record.id.clone());
        thread::spawn(move || rt.release(&env, &id))
    };
    // The release takes a second inside the provider; look for its mark.
    let started = Instant::now();
    while rt.store().get(&record.id).unwrap().unwrap().state != LeaseState::Closing
        && started.elapsed() < Duration::from_millis(800)
    {
        thread::sleep(Duration::from_millis(10));
    }
    let outcome = rt.execute(&env, &record.id, &command("echo"), None, CancelToken::new());
    assert!(
        outcome.is_err(),
        "a command ran while the lease was being released: {outcome:?}"
    );
    let message = format!("{:#}", outcome.unwrap_err());
    assert!(message.contains("releasing"), "{message}");
    releasing.join().unwrap().unwrap().unwrap();
    assert_eq!(
        rt.store().get(&record.id).unwrap().unwrap().state,
        LeaseState::Released
    );
}

/// Pins issue 9 item 3: an `expired` resume was recorded as destroyed
/// without deleting anything, though the sandbox may still exist. Now the
/// host destroys it first; when that delete fails, the lease is poisoned.
#[test]
fn an_expired_resume_destroys_the_sandbox_before_forgetting_the_lease() {
    let rt = runtime(Arc::new(SqliteLeases::open_in_memory().unwrap()));
    for (config, state) in [
        (r#"{"mode":"resume-expired"}"#, LeaseState::Destroyed),
        (
            r#"{"mode":"resume-expired destroy-fails"}"#,
            LeaseState::Poisoned,
        ),
    ] {
        let env = rt
            .environment("co", "env", config, &Secrets::none())
            .unwrap();
        let record = rt.acquire(&env, &acquire("r4")).unwrap().unwrap();
        rt.release(&env, &record.id).unwrap().unwrap();
        let outcome = rt.resume(&env, &record.id).unwrap();
        let stored = rt.store().get(&record.id).unwrap().unwrap();
        assert_eq!(stored.state, state, "{config}: {stored:?}");
        let reason = stored.reason.unwrap();
        assert!(reason.contains("expired"), "{reason}");
        match state {
            LeaseState::Destroyed => {
                assert!(
                    matches!(outcome, Ok(ResumeOutcome::Expired(_))),
                    "{outcome:?}"
                );
                assert!(reason.contains("deleted"), "{reason}");
            }
            _ => assert!(
                matches!(outcome, Err(ProviderError::CleanupFailed(_))),
                "{outcome:?}"
            ),
        }
    }
}

/// The tables of a SQLite store written before both stores shared one
/// schema (`leases`, `hosts`), as the previous release made them.
const OLDER_SQLITE_SCHEMA: &str = "
    CREATE TABLE leases (id TEXT PRIMARY KEY, provider TEXT NOT NULL,
        company_id TEXT NOT NULL, environment_id TEXT NOT NULL, run_id TEXT NOT NULL,
        config TEXT NOT NULL, state TEXT NOT NULL, reason TEXT, provider_lease_id TEXT,
        metadata TEXT, expires_at TEXT, created_ms INTEGER NOT NULL,
        updated_ms INTEGER NOT NULL, busy_pid INTEGER, busy_owner TEXT,
        busy_count INTEGER NOT NULL DEFAULT 0, closing_owner TEXT);
    CREATE INDEX leases_state ON leases(state);
    CREATE TABLE hosts (id TEXT PRIMARY KEY, pid INTEGER NOT NULL, hostname TEXT NOT NULL,
        started_ms INTEGER NOT NULL, heartbeat_ms INTEGER NOT NULL, expiry_ms INTEGER NOT NULL);";

fn sqlite_tables(path: &std::path::Path) -> Vec<String> {
    let conn = rusqlite::Connection::open(path).unwrap();
    let mut statement = conn
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        .unwrap();
    let names = statement.query_map([], |row| row.get(0)).unwrap();
    names.map(Result::unwrap).collect()
}

/// Both stores keep leases in one table name now (`sandbox_leases`): a
/// SQLite file of the previous release must keep its leases (a poisoned
/// one stays poisoned, a busy mark of a vanished host still poisons), and
/// rows an older `sandbox` writes into a recreated old table later are
/// merged at the next open, never lost.
#[test]
fn an_older_sqlite_store_keeps_its_leases_under_the_shared_table_name() {
    let path = store_file("older-tables");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(OLDER_SQLITE_SCHEMA).unwrap();
        conn.execute_batch(
            "INSERT INTO leases VALUES ('P', 'test', 'co', 'env', 'r1', '{}', 'poisoned',
                'cleanup failed', 'sb-1', '{}', NULL, 1, 1, NULL, NULL, 0, NULL);
             INSERT INTO leases VALUES ('B', 'test', 'co', 'env', 'r2', '{}', 'active',
                NULL, 'sb-2', '{}', NULL, 2, 2, NULL, 'host-gone', 1, NULL);
             INSERT INTO hosts VALUES ('host-old', 1, 'm', 0, 0, 10000);",
        )
        .unwrap();
    }
    let ctx = sandbox_host::types::EnvironmentContext {
        driver_key: "test".into(),
        company_id: "co".into(),
        environment_id: "env".into(),
        issue_id: None,
        config: "{}".into(),
    };
    {
        let store = Arc::new(SqliteLeases::open(&path).unwrap());
        let ids: Vec<String> = store.list().unwrap().into_iter().map(|l| l.id).collect();
        assert_eq!(ids, ["P", "B"]);
        let poisoned = store.get("P").unwrap().unwrap();
        assert_eq!(poisoned.state, LeaseState::Poisoned);
        assert_eq!(poisoned.reason.as_deref(), Some("cleanup failed"));
        assert_eq!(
            poisoned.lease.unwrap().provider_lease_id,
            "sb-1",
            "the sandbox id survives the move"
        );
        let me = store.register_host(short_liveness()).unwrap();
        let refused = store
            .begin("B", Operation::Execute, &ctx, me.id())
            .unwrap_err();
        assert!(
            refused.to_string().contains("B"),
            "a busy mark of a host without a record still refuses: {refused}"
        );
        assert_eq!(store.get("B").unwrap().unwrap().state, LeaseState::Poisoned);
    }
    let tables = sqlite_tables(&path);
    assert!(
        tables.contains(&"sandbox_leases".to_owned())
            && tables.contains(&"sandbox_hosts".to_owned()),
        "{tables:?}"
    );
    assert!(
        !tables.contains(&"leases".to_owned()) && !tables.contains(&"hosts".to_owned()),
        "the old tables are gone once their rows moved: {tables:?}"
    );

    // An older `sandbox` opening the file recreates its tables and records
    // a lease there; the next open merges it.
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(OLDER_SQLITE_SCHEMA).unwrap();
        conn.execute_batch(
            "INSERT INTO leases VALUES ('N', 'test', 'co', 'env', 'r3', '{}', 'active',
                NULL, 'sb-3', '{}', NULL, 3, 3, NULL, NULL, 0, NULL);",
        )
        .unwrap();
    }
    let store = SqliteLeases::open(&path).unwrap();
    let ids: Vec<String> = store.list().unwrap().into_iter().map(|l| l.id).collect();
    assert_eq!(ids, ["P", "B", "N"]);
    assert_eq!(store.get("N").unwrap().unwrap().state, LeaseState::Active);
    assert!(!sqlite_tables(&path).contains(&"leases".to_owned()));
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}
