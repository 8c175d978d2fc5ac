//! Config parsing: any input validates to a config or to error messages,
//! never a panic; a normalised config validates again to itself; an API
//! URL never reaches a message (it may hold credentials).
//!
//! Input: any bytes, used as the config text, and its halves around a
//! canary as an `apiUrl`.
#![no_main]

use createos_provider::config::{normalize_api_url, Config};
use libfuzzer_sys::fuzz_target;
use provider_sdk::config::{ProviderConfig, Validation};
use serde_json::json;

fn validate(text: &str) -> Validation<Config> {
    Config::validate(text)
}

const CANARY: &str = "CANARYx7q";

fn check(text: &str) {
    let validation = validate(text);
    assert_eq!(validation.config.is_some(), validation.errors.is_empty());
    assert_eq!(validation.config.is_some(), validation.normalized.is_some());
    if let (Some(config), Some(normalized)) = (&validation.config, &validation.normalized) {
        let again = validate(normalized);
        assert!(again.errors.is_empty(), "{:?}", again.errors);
        assert!(again.warnings.is_empty(), "{:?}", again.warnings);
        assert_eq!(again.config.as_ref(), Some(config));
        assert_eq!(again.normalized.as_deref(), Some(normalized.as_str()));
        assert_eq!(
            normalize_api_url(&config.api_origin).as_deref(),
            Ok(config.api_origin.as_str())
        );
    }
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    check(&text);

    let mid = text
        .char_indices()
        .nth(text.chars().count() / 2)
        .map_or(text.len(), |(i, _)| i);
    let url = format!("{}{CANARY}{}", &text[..mid], &text[mid..]);
    let config = json!({ "apiUrl": url, "shape": text.as_ref() }).to_string();
    check(&config);
    let validation = validate(&config);
    for message in validation.errors.iter().chain(&validation.warnings) {
        // `shape` is echoed (64 printable characters); the URL never is.
        let without_shape = message.replace(&text.chars().take(64).collect::<String>(), "");
        assert!(
            !without_shape.contains(CANARY) || text.contains(CANARY),
            "{message}"
        );
    }
    if let Ok(origin) = normalize_api_url(&url) {
        assert_eq!(normalize_api_url(&origin), Ok(origin.clone()));
    }
});
