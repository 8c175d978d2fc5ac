//! The user's terminal while a command runs with `-t`: raw mode (every
//! key, `^C` included, goes to the sandbox's terminal as a byte), its
//! window size, and its restoration on every way out: the end of the
//! command, an error (the guard's drop), a panic (a hook), and the second
//! signal that abandons a cleanup ([`restore`] before that exit).

use std::io::IsTerminal;
use std::os::fd::BorrowedFd;
use std::sync::Mutex;

use rustix::termios::{self, OptionalActions, Termios};
use sandbox_host::types::TerminalSize;

/// The mode the terminal had before raw mode, while raw mode is on.
static SAVED: Mutex<Option<Termios>> = Mutex::new(None);

/// The size a terminal gets when this process has none to copy.
pub const DEFAULT_SIZE: TerminalSize = TerminalSize {
    columns: 80,
    rows: 24,
};

fn stdin() -> BorrowedFd<'static> {
    rustix::stdio::stdin()
}

/// Raw mode on this process's stdin (a terminal) while it lives; the
/// earlier mode back when it drops.
pub struct RawMode(());

impl RawMode {
    /// Puts stdin in raw mode; `None` when stdin is not a terminal (input
    /// is then passed on as it comes, with no mode to change).
    pub fn enter() -> std::io::Result<Option<RawMode>> {
        if !std::io::stdin().is_terminal() {
            return Ok(None);
        }
        let saved = termios::tcgetattr(stdin())?;
        let mut raw = saved.clone();
        raw.make_raw();
        *lock() = Some(saved);
        install_panic_hook();
        if let Err(error) = termios::tcsetattr(stdin(), OptionalActions::Now, &raw) {
            restore();
            return Err(error.into());
        }
        Ok(Some(RawMode(())))
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        restore();
    }
}

/// Gives the terminal back the mode it had before raw mode, if raw mode
/// is on; safe to call from any thread, any number of times.
pub fn restore() {
    if let Some(saved) = lock().take() {
        let _ = termios::tcsetattr(stdin(), OptionalActions::Now, &saved);
    }
}

fn lock() -> std::sync::MutexGuard<'static, Option<Termios>> {
    SAVED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Restores the terminal before the default panic message, once.
fn install_panic_hook() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore();
            previous(info);
        }));
    });
}

/// The window size of this process's terminal (stdin's, else stdout's),
/// `None` when neither is a terminal or it has no size.
pub fn window_size() -> Option<TerminalSize> {
    let fds = [rustix::stdio::stdin(), rustix::stdio::stdout()];
    fds.into_iter().find_map(|fd| {
        let size = termios::tcgetwinsize(fd).ok()?;
        (size.ws_col > 0 && size.ws_row > 0).then_some(TerminalSize {
            columns: size.ws_col,
            rows: size.ws_row,
        })
    })
}
