//! The start-up probe runs a command in a machine of its own, with the
//! groups of a sandbox; they go with it. Every server start left one empty
//! cgroup v1 pids group (`createos-local/sandbox-<uid>`) behind for good
//! (79 of them on this machine after a day of runs). A binary of its own:
//! no other test makes or removes groups meanwhile.

use sandbox_engine::{IsolationMode, IsolationPreference, Server};

fn sandbox_groups(base: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(base)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("sandbox-"))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_servers_start_up_probe_leaves_no_cgroup_behind() {
    let Some(base) = sandbox_engine::trees::cgroup_v1::pids_cgroup_base() else {
        test_support::skipped(
            "a_servers_start_up_probe_leaves_no_cgroup_behind: no cgroup v1 pids hierarchy \
             this server can write (not root, or cgroup v2 only)",
        );
        return;
    };
    for _ in 0..3 {
        let before = sandbox_groups(base);
        let server = Server::builder()
            .isolation(IsolationPreference::RequireBwrap)
            .api_key("probe-groups-key")
            .quiet(true)
            .start()
            .await
            .expect("the server starts");
        assert_eq!(*server.isolation(), IsolationMode::Bwrap);
        let after_start = sandbox_groups(base);
        let report = server.shutdown().await;
        assert!(report.all_exited(), "{report:?}");
        assert_eq!(after_start, before, "groups left by the probe");
        assert_eq!(sandbox_groups(base), before, "groups left by the server");
    }
}
