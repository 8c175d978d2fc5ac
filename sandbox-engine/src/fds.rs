//! Descriptor hygiene for a child between fork and exec: nothing the
//! server holds open leaks into a command, a launcher or the death guard.
//! It depends on nothing else in the crate, so every module that starts a
//! process (even [`crate::deathguard`], at the bottom) can use it.

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
