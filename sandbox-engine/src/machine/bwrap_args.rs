//! bubblewrap's command line for a sandbox (its namespaces, mounts and
//! working directory), shared by one-shot commands ([`crate::machine::isolation`])
//! and a sandbox's long-lived machine ([`crate::machine`]), and the fixed
//! environment of the host-side launcher.

use std::path::Path;

/// Size of each command's `/dev/shm` (a tmpfs: host memory), 64 MiB. The
/// rest of `/dev` is read-only.
pub const DEV_SHM_SIZE: u64 = 64 << 20;

/// bwrap's command line for a sandbox machine (see [`crate::machine`]):
/// the same namespaces and mounts as a command's, working directory `/`.
/// With `--die-with-parent`: the kernel ends the machine when the thread
/// that started it ends, which is the lasting thread of
/// [`crate::machine::lasting_spawner`], so when the server's process ends
/// however it ends (SIGKILL included, and before any record of the
/// machine is written). A machine's outer bwrap exits only with its init,
/// so the flag ends nothing a command left running.
pub(crate) fn machine_bwrap_args(root: &Path, status_fd: i32) -> Vec<String> {
    let mut args = vec!["--die-with-parent".to_string()];
    args.extend(bwrap_args(root, "/", Some(status_fd)));
    args
}

/// The environment of the host-side launcher (bwrap's outer process): the
/// server's fixed minimal one, never a value from the API. bwrap runs on
/// the host, unconfined, before any namespace exists, so whatever its
/// environment names is honoured there: `LD_PRELOAD`, `LD_LIBRARY_PATH`,
/// `GCONV_PATH`, `LOCPATH`, `MALLOC_*`, … would run a sandbox's code on
/// the host (issue 24 item 2). The sandbox's and the process's env are
/// instead handed to bwrap as `--clearenv --setenv K V …` arguments (read
/// from a memfd, so they are not on a world-readable command line) which
/// bwrap applies after it has started, only to the command it then runs
/// inside the namespaces. Those names therefore need not be refused at
/// the API: they reach only the sandboxed process, where they can do
/// nothing the command could not do itself.
pub fn launcher_env() -> Vec<(String, String)> {
    vec![
        ("PATH".to_string(), "/usr/bin:/bin".to_string()),
        ("LANG".to_string(), "C.UTF-8".to_string()),
    ]
}

/// bwrap's command line (everything before `--`).
///
/// Namespaces: user (the command is uid 0 inside, the sandbox's own
/// unprivileged uid outside when the server is root, see
/// [`crate::storage::rootfs`]), PID,
/// network (only a loopback interface of its own), IPC and UTS (host name
/// `sandbox`). bwrap runs unprivileged, so every capability is dropped.
///
/// Where user namespaces are refused but this server may make the others
/// ([`crate::machine::namespaces_without_user_here`]: uid 0 of a
/// container's user namespace), bwrap makes no user namespace: the
/// command runs as the server's own uid with every capability dropped.
pub(crate) fn bwrap_args(root: &Path, cwd: &str, status_fd: Option<i32>) -> Vec<String> {
    let user: &[&str] = if crate::machine::namespaces_without_user_here() {
        &["--cap-drop", "ALL"]
    } else {
        &["--unshare-user", "--uid", "0", "--gid", "0"]
    };
    let mut args: Vec<String> = user.iter().map(|a| a.to_string()).collect();
    args.extend(
        [
            "--unshare-pid",
            "--unshare-net",
            "--unshare-ipc",
            "--unshare-uts",
            "--hostname",
            "sandbox",
            "--bind",
        ]
        .map(String::from),
    );
    args.push(root.display().to_string());
    args.push("/".to_string());
    for dir in crate::storage::rootfs::HOST_DIRS {
        let host = Path::new("/").join(dir);
        let Ok(meta) = std::fs::symlink_metadata(&host) else {
            continue;
        };
        // Symlinks (`/bin -> usr/bin`) were copied into the root by
        // `prepare_root`; real directories are bind-mounted read-only.
        if meta.is_dir() {
            let h = host.display().to_string();
            args.extend(["--ro-bind".to_string(), h.clone(), h]);
        }
    }
    args.extend([
        "--ro-bind".to_string(),
        crate::storage::rootfs::etc_template(root)
            .display()
            .to_string(),
        "/etc".to_string(),
    ]);
    // The directories of links bound rather than copied (see
    // `ETC_BOUND_FROM_HOST`), over their empty mount points in the copy.
    for host in crate::storage::rootfs::etc_bound_from_host() {
        let h = host.display().to_string();
        args.extend(["--ro-bind".to_string(), h.clone(), h]);
    }
    // A fresh `/dev` (device nodes bound from the host), made read-only
    // once populated, and a small `/dev/shm`: both are tmpfs, which the
    // kernel sizes at half the host's RAM by default, so a writable one
    // let any command hold that much host memory (issue 24 item 3).
    args.extend(["--dev", "/dev"].map(String::from));
    args.extend([
        "--size".to_string(),
        DEV_SHM_SIZE.to_string(),
        "--tmpfs".to_string(),
        "/dev/shm".to_string(),
        "--remount-ro".to_string(),
        "/dev".to_string(),
        "--proc".to_string(),
        "/proc".to_string(),
    ]);
    if let Some(fd) = status_fd {
        args.extend(["--json-status-fd".to_string(), fd.to_string()]);
    }
    args.extend(["--chdir".to_string(), cwd.to_string()]);
    args
}
