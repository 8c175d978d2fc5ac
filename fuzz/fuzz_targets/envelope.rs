//! The JSend envelope parser: any status and body give the data object of
//! a 2xx success envelope, or a typed `ApiError`; never a panic. Ids taken
//! from the data always match the spec's pattern.
//!
//! Input: bytes 0-1 are the HTTP status (mostly 2xx), the rest the body.
#![no_main]

use createos_provider::api::parse_envelope;
use libfuzzer_sys::fuzz_target;
use provider_sdk::errors::ApiError;
use provider_sdk::http::{id_field, is_valid_id, string_field};
use provider_sdk::platform::Response;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let raw = u16::from_le_bytes([data[0], data[1]]);
    // Half the inputs get a 2xx so the body parser is what is fuzzed.
    let status = if raw & 1 == 0 {
        200 + (raw >> 1) % 100
    } else {
        raw >> 1
    };
    let body = data[2..].to_vec();
    let response = Response {
        status,
        body: body.clone(),
    };
    match parse_envelope(&response) {
        Ok(map) => {
            assert!((200..300).contains(&status));
            let value: Value = serde_json::from_slice(&body).expect("accepted JSON");
            assert_eq!(value["status"], "success");
            assert_eq!(value["data"], Value::Object(map.clone()));
            for field in ["id", "process_id", "status"] {
                if let Ok(id) = id_field(&map, field) {
                    assert!(is_valid_id(&id));
                    assert_eq!(string_field(&map, field).ok(), Some(id.as_str()));
                }
            }
        }
        Err(ApiError::Status(s)) => {
            assert_eq!(s, status);
            assert!(!(200..300).contains(&status));
        }
        Err(ApiError::Invalid(reason)) => {
            assert!((200..300).contains(&status));
            // A fixed reason: never the body.
            assert!(reason.len() < 80 && !reason.contains('{'), "{reason}");
        }
        Err(ApiError::Transport(_)) => panic!("no transport here"),
    }
});
