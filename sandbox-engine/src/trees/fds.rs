//! Descriptor hygiene for a child between fork and exec: nothing the
//! server holds open leaks into a command, a launcher or the death guard.
//! And the server's own descriptors: how many it may still open, and how
//! many it keeps free for proving sandboxes gone ([`NEW_WORK_RESERVE`],
//! [`CONNECTION_RESERVE`]).
//! It depends on nothing else in the crate, so every module that starts a
//! process (even [`crate::trees::deathguard`], at the bottom) can use it.

/// Descriptors kept free for proving sandboxes gone (issue 40 item 2):
/// a process start or a sandbox creation is refused (503
/// `out_of_descriptors`) while fewer are free. A proof needs a handful at
/// a time (the `/proc` listing, one `status` file, `mountinfo`, the loop
/// devices' listing, a pidfd per SIGKILL).
pub const NEW_WORK_RESERVE: u64 = 64;

/// Below this many free descriptors the API and toolbox listeners take
/// no connection to serve: waiting connections are answered 503 one at a
/// time and closed, and the sandboxes' egress proxies take none.
pub const CONNECTION_RESERVE: u64 = 32;

/// How many more descriptors this process may open now: its soft
/// `RLIMIT_NOFILE` less the descriptors open (counted in `/proc/self/fd`).
/// 0 when they cannot be counted (counting needs one descriptor itself).
pub fn headroom() -> u64 {
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(u64::MAX);
    match std::fs::read_dir("/proc/self/fd") {
        // The listing's own descriptor is among the entries.
        Ok(entries) => limit.saturating_sub(entries.count().saturating_sub(1) as u64),
        Err(_) => 0,
    }
}

/// [`headroom`] for callers on a hot path (each accepted connection):
/// counting `/proc/self/fd` costs about a millisecond per thousand
/// descriptors, which made accepting a burst of 600 connections take
/// seconds. Far from the limit (more than [`COUNT_ALWAYS_BELOW`] free) a
/// count is reused for up to 100 ms, less one for each call (each call
/// is about to take a descriptor); near it, every call counts.
pub fn headroom_fast() -> u64 {
    static LAST: std::sync::Mutex<Option<(std::time::Instant, u64)>> = std::sync::Mutex::new(None);
    let mut last = LAST.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((at, free)) = *last {
        if free > COUNT_ALWAYS_BELOW && at.elapsed() < std::time::Duration::from_millis(100) {
            *last = Some((at, free - 1));
            return free - 1;
        }
    }
    let free = headroom();
    *last = Some((std::time::Instant::now(), free));
    free
}

/// Below this many free descriptors [`headroom_fast`] counts every time.
pub const COUNT_ALWAYS_BELOW: u64 = 256;

/// Marks every descriptor from `first` up close-on-exec. Async-signal-safe
/// (runs between fork and exec): one `close_range` call, or on kernels
/// without it (before 5.11) `fcntl` on each number up to the descriptor
/// limit.
pub fn mark_cloexec_from(first: u32) {
    // SAFETY: plain system calls on descriptor numbers; no memory is touched.
    unsafe {
        let done = libc::syscall(
            libc::SYS_close_range,
            first,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        ) == 0;
        if done {
            return;
        }
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        let max = if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
            lim.rlim_cur.min(1 << 20) as i32
        } else {
            1 << 16
        };
        for fd in first as i32..max {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags >= 0 {
                libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
            }
        }
    }
}
