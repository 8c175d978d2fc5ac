//! Hard expiries: the RFC 3339 times of an acquire's
//! `requested-expires-at` and of the backend's attested `expires_at`, read
//! as milliseconds since the Unix epoch so that the two compare whatever
//! their offsets and fractions.

/// Milliseconds since the Unix epoch of an RFC 3339 date-time
/// (`YYYY-MM-DDTHH:MM:SS[.fraction](Z|±HH:MM)`, `T` or a space between
/// date and time); digits below the millisecond round up when `round_up`
/// (an attested expiry is never taken as earlier than it is), else down.
/// `None` when the text is not such a time.
pub fn millis(text: &str, round_up: bool) -> Option<i64> {
    let b = text.as_bytes();
    let num = |from: usize, len: usize| -> Option<i64> {
        b.get(from..from + len)?.iter().try_fold(0i64, |n, &c| {
            c.is_ascii_digit().then(|| n * 10 + i64::from(c - b'0'))
        })
    };
    let separators = [(4, b'-'), (7, b'-'), (13, b':'), (16, b':')];
    if b.len() < 20
        || separators.iter().any(|&(at, c)| b[at] != c)
        || !matches!(b[10], b'T' | b't' | b' ')
    {
        return None;
    }
    let (year, month, day) = (num(0, 4)?, num(5, 2)?, num(8, 2)?);
    let (hour, minute, second) = (num(11, 2)?, num(14, 2)?, num(17, 2)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 {
        return None;
    }
    // A leap second (60) counts as the next second's start.
    if second > 60 {
        return None;
    }
    let mut at = 19;
    let mut ms = 0;
    if b[at] == b'.' {
        let digits = b[at + 1..]
            .iter()
            .take_while(|c| c.is_ascii_digit())
            .count();
        if digits == 0 {
            return None;
        }
        for (i, &c) in b[at + 1..at + 1 + digits].iter().enumerate() {
            let digit = i64::from(c - b'0');
            match i {
                0..=2 => ms += digit * [100, 10, 1][i],
                _ if round_up && digit != 0 => {
                    ms += 1;
                    break;
                }
                _ => {}
            }
        }
        at += 1 + digits;
    }
    let offset_minutes = match &b[at..] {
        [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), _, _, b':', _, _] => {
            let (h, m) = (num(at + 1, 2)?, num(at + 4, 2)?);
            if h > 23 || m > 59 {
                return None;
            }
            if *sign == b'+' {
                h * 60 + m
            } else {
                -(h * 60 + m)
            }
        }
        _ => return None,
    };
    // Days since the epoch of the civil date (proleptic Gregorian; the
    // year taken to start in March so that the leap day comes last).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400;
    let day_of_year = (153 * ((month + 9) % 12) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    let days = era * 146_097 + day_of_era - 719_468;
    let seconds = days * 86_400 + hour * 3600 + minute * 60 + second - offset_minutes * 60;
    Some(seconds * 1000 + ms)
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn times_read_as_milliseconds_since_the_epoch() {
        assert_eq!(millis("1970-01-01T00:00:00Z", false), Some(0));
        // `date -u -d 2026-12-07T03:25:51Z +%s` = 1796613951.
        assert_eq!(
            millis("2026-12-07T03:25:51Z", false),
            Some(1_796_613_951_000)
        );
        assert_eq!(
            millis("2026-12-07T03:25:51.250Z", false),
            Some(1_796_613_951_250)
        );
        // The same instant with an offset, and a leap day.
        assert_eq!(
            millis("2026-12-07T05:55:51+02:30", false),
            millis("2026-12-07T03:25:51Z", false)
        );
        assert_eq!(
            millis("2024-02-29T00:00:00Z", false),
            Some(1_709_164_800_000)
        );
        assert_eq!(millis("1969-12-31T23:59:59-00:00", false), Some(-1000));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn digits_below_the_millisecond_round_as_asked() {
        let t = "2026-12-07T03:25:51.2501Z";
        assert_eq!(millis(t, false), Some(1_796_613_951_250));
        assert_eq!(millis(t, true), Some(1_796_613_951_251));
        assert_eq!(
            millis("2026-12-07T03:25:51.2500000Z", true),
            Some(1_796_613_951_250)
        );
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn other_text_is_not_a_time() {
        for bad in [
            "",
            "2026-12-07",
            "2026-12-07T03:25:51",
            "2026-12-07T03:25:51+0200",
            "2026-13-07T03:25:51Z",
            "2026-12-07T24:00:00Z",
            "2026-12-07T03:25:51.Z",
            "2026-12-07T03:25:51Zjunk",
            "2026-12-07T03:25:5xZ",
            "tomorrow at noon please",
        ] {
            assert_eq!(millis(bad, false), None, "{bad}");
        }
    }
}
