//! Small helpers: random ids, RFC 3339 timestamps, byte sizes, finding
//! a program in `PATH` and the pauses of a wait that polls ([`Backoff`])
//! (no crate but `thiserror` for a size it cannot read). Uses nothing
//! else in the crate.

use std::io::Read;
use std::time::{SystemTime, UNIX_EPOCH};

/// `n` random bytes as lowercase hex, from `/dev/urandom`. Falls back to a
/// time-and-counter mix if `/dev/urandom` cannot be read (ids stay unique
/// within the process, they are just not unpredictable then).
pub fn random_hex(n: usize) -> String {
    let mut buf = vec![0u8; n];
    let ok = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .is_ok();
    if !ok {
        use std::sync::atomic::{AtomicU64, Ordering};
        // Process-wide: ids must stay unique across every server of the process.
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let mut x = nanos ^ COUNTER.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed);
        for b in &mut buf {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
    }
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

/// The current time as RFC 3339 UTC with milliseconds,
/// e.g. `2026-12-02T16:28:08.123Z`.
pub fn now_rfc3339() -> String {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    format_rfc3339(d.as_secs(), d.subsec_millis())
}

/// Seconds since the epoch as RFC 3339 UTC (times before 1970 read as 1970).
pub fn rfc3339(secs: i64) -> String {
    format_rfc3339(secs.max(0) as u64, 0)
}

/// A point in time as RFC 3339 UTC with milliseconds (times before 1970
/// read as 1970).
pub fn rfc3339_of(time: SystemTime) -> String {
    let d = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    format_rfc3339(d.as_secs(), d.subsec_millis())
}

fn format_rfc3339(secs: u64, millis: u32) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}

/// Howard Hinnant's days-to-civil algorithm.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Parses an RFC 3339 time (`2026-12-07T00:48:06.123Z`, a fraction of any
/// length, `Z` or a numeric offset) into seconds since the epoch, the
/// fraction dropped (an earlier instant, never a later one). `None` for
/// anything else, or a time before 1970.
pub fn parse_rfc3339(text: &str) -> Option<u64> {
    let b = text.as_bytes();
    let num = |from: usize, len: usize| -> Option<i64> {
        let part = b.get(from..from + len)?;
        part.iter()
            .all(u8::is_ascii_digit)
            .then(|| part.iter().fold(0i64, |n, d| n * 10 + i64::from(d - b'0')))
    };
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't') {
        return None;
    }
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let (y, m, d) = (num(0, 4)?, num(5, 2)?, num(8, 2)?);
    let (hh, mm, ss) = (num(11, 2)?, num(14, 2)?, num(17, 2)?);
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) || hh > 23 || mm > 59 || ss > 60 {
        return None;
    }
    let mut at = 19;
    if b.get(at) == Some(&b'.') {
        at += 1;
        let digits = b[at..].iter().take_while(|c| c.is_ascii_digit()).count();
        if digits == 0 {
            return None;
        }
        at += digits;
    }
    let offset = match b.get(at..)? {
        [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), _, _, b':', _, _] => {
            let (oh, om) = (num(at + 1, 2)?, num(at + 4, 2)?);
            if oh > 23 || om > 59 {
                return None;
            }
            let minutes = oh * 60 + om;
            if *sign == b'+' {
                minutes * 60
            } else {
                -minutes * 60
            }
        }
        _ => return None,
    };
    let secs = days_from_civil(y, m as u32, d as u32) * 86_400 + hh * 3600 + mm * 60 + ss - offset;
    u64::try_from(secs).ok()
}

/// Howard Hinnant's civil-to-days algorithm (the inverse of `civil_from_days`).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = i64::from(if m > 2 { m - 3 } else { m + 9 });
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// A size that could not be read (`--sandbox-disk`, `--finished-output`):
/// the text as given, and what a size looks like.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidSize {
    /// Not a number with a binary unit.
    #[error("invalid size {text:?}: expected a number with K, M, G or T, for example 2G")]
    Unreadable {
        /// The text as given.
        text: String,
    },
    /// More bytes than a 64-bit count holds.
    #[error("size {text:?} is too large")]
    TooLarge {
        /// The text as given.
        text: String,
    },
}

/// Parses a size such as `2G`, `512M`, `65536K` or `1073741824` (binary
/// units, an optional `B` or `iB`).
pub fn parse_bytes(text: &str) -> Result<u64, InvalidSize> {
    let t = text.trim();
    let (digits, unit) = match t.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => t.split_at(i),
        None => (t, ""),
    };
    let invalid = || InvalidSize::Unreadable {
        text: text.to_string(),
    };
    let shift = match unit
        .trim()
        .to_ascii_uppercase()
        .trim_end_matches("IB")
        .trim_end_matches('B')
    {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => return Err(invalid()),
    };
    let n: u64 = digits.parse().map_err(|_| invalid())?;
    n.checked_shl(shift)
        .filter(|b| b >> shift == n)
        .ok_or_else(|| InvalidSize::TooLarge {
            text: text.to_string(),
        })
}

/// The first `name` in the server's `PATH` (how the server finds bwrap).
pub fn find_in_path(name: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Makes a new directory `PREFIX-<random hex>` in `parent`: unique even
/// when a prefix repeats or a directory of an earlier run was left there
/// (a few names are tried).
pub fn new_unique_dir(
    parent: &std::path::Path,
    prefix: &str,
) -> std::io::Result<std::path::PathBuf> {
    let mut attempt = 0;
    loop {
        let dir = parent.join(format!("{prefix}-{}", random_hex(4)));
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempt < 8 => {
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// `path` as `/proc/self/mountinfo` writes it (space, tab, newline and
/// backslash in octal).
pub(crate) fn mountinfo_escaped(path: &std::path::Path) -> String {
    let mut out = String::new();
    for c in path.to_string_lossy().chars() {
        match c {
            ' ' => out.push_str("\\040"),
            '\t' => out.push_str("\\011"),
            '\n' => out.push_str("\\012"),
            '\\' => out.push_str("\\134"),
            c => out.push(c),
        }
    }
    out
}

/// The pauses between the checks of a wait that polls for something that
/// usually happens within a millisecond or two (a tree gone, a disk
/// detached, a machine's init reaped): 0.2 ms, doubling each time, never
/// more than `max`. A fixed pause of several milliseconds made every such
/// wait last at least that long, on the path of every sandbox's start and
/// end (issue 41).
#[derive(Debug, Clone)]
pub struct Backoff {
    next: std::time::Duration,
    max: std::time::Duration,
}

impl Backoff {
    /// Pauses from 0.2 ms up to `max`.
    pub fn up_to(max: std::time::Duration) -> Self {
        Backoff {
            next: std::time::Duration::from_micros(200).min(max),
            max,
        }
    }

    /// The pause before the next check.
    pub fn next_pause(&mut self) -> std::time::Duration {
        let pause = self.next;
        self.next = (self.next * 2).min(self.max);
        pause
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_parses_what_it_formats_and_refuses_the_rest() {
        for secs in [0u64, 1, 951_782_400, 1_796_603_286, 4_102_444_800] {
            assert_eq!(parse_rfc3339(&rfc3339(secs as i64)), Some(secs));
        }
        assert_eq!(
            parse_rfc3339("2026-12-07T00:48:06.999Z"),
            parse_rfc3339("2026-12-07T00:48:06Z")
        );
        assert_eq!(
            parse_rfc3339("2026-12-07T02:48:06+02:00"),
            parse_rfc3339("2026-12-07T00:48:06Z")
        );
        for bad in [
            "",
            "2026-12-07",
            "2026-12-07T00:48:06",
            "2026-13-07T00:48:06Z",
            "2026-12-07T00:48:06.Z",
            "2026-12-07T00:48:06Zjunk",
            "1969-12-31T23:59:59Z",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
    }

    #[test]
    fn formats_known_dates() {
        assert_eq!(format_rfc3339(0, 0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_rfc3339(951_782_400, 5), "2000-02-29T00:00:00.005Z");
        assert_eq!(format_rfc3339(1_796_229_000, 0), "2026-12-02T16:30:00.000Z");
    }

    #[test]
    fn random_hex_has_the_right_length() {
        assert_eq!(random_hex(8).len(), 16);
        assert_ne!(random_hex(8), random_hex(8));
    }

    #[test]
    fn a_backoff_starts_short_and_doubles_up_to_its_cap() {
        let mut b = Backoff::up_to(std::time::Duration::from_millis(5));
        let pauses: Vec<u128> = (0..8).map(|_| b.next_pause().as_micros()).collect();
        assert_eq!(pauses, [200, 400, 800, 1600, 3200, 5000, 5000, 5000]);
    }
}
