//! What every provider's `interact` needs besides its API: the names of
//! the signals a host may ask for, and the base64 text its input travels
//! in where an API takes text.

use crate::types::InteractionSignal;

/// The signal's conventional name (`SIGINT`, ...), as APIs and results
/// spell it.
pub fn signal_name(signal: InteractionSignal) -> &'static str {
    match signal {
        InteractionSignal::Interrupt => "SIGINT",
        InteractionSignal::Terminate => "SIGTERM",
        InteractionSignal::Hangup => "SIGHUP",
        InteractionSignal::Quit => "SIGQUIT",
        InteractionSignal::Kill => "SIGKILL",
    }
}

/// Standard base64 with padding, appended to `out`. (The base64 crate's
/// encoder is generic and cost about 2 KiB of a component held to
/// 400 KiB; input is the one thing providers encode.)
pub fn base64_into(out: &mut String, bytes: &[u8]) {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let letter = |index: u32| ALPHABET[(index & 63) as usize] as char;
    for group in bytes.chunks(3) {
        let b = |i: usize| group.get(i).copied().unwrap_or(0) as u32;
        let n = (b(0) << 16) | (b(1) << 8) | b(2);
        out.push(letter(n >> 18));
        out.push(letter(n >> 12));
        out.push(if group.len() > 1 { letter(n >> 6) } else { '=' });
        out.push(if group.len() > 2 { letter(n) } else { '=' });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    /// What RFC 4648 gives for its test vectors, padding included.
    #[wasm_bindgen_test(unsupported = test)]
    fn base64_is_standard_with_padding() {
        for (bytes, text) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            let mut ours = String::new();
            base64_into(&mut ours, bytes.as_bytes());
            assert_eq!(ours, text, "{bytes:?}");
        }
        let mut all = String::new();
        base64_into(&mut all, &[0xfb, 0xff, 0xbf]);
        assert_eq!(all, "+/+/");
    }
}
