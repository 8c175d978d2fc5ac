//! `describe`, `validate-config`, and config / lease checks that happen
//! before any request.

use crate::support::*;
use sandbox_host::types::*;
use serde_json::json;

#[test]
fn describe_declares_the_secret_header_and_rate_limit() {
    let description = Fake::new().instance().describe().unwrap();
    assert_eq!(description.driver_key, "createos");
    assert_eq!(description.display_name, "CreateOS");
    let limit = description
        .rate_limit
        .expect("CreateOS declares its rate limit");
    assert_eq!(
        (limit.requests, limit.window_ms, limit.per_second),
        (300, 60_000, None)
    );
    assert_eq!(description.secrets.len(), 1);
    let secret = &description.secrets[0];
    assert_eq!(
        (secret.config_field.as_str(), secret.header.as_str()),
        ("apiKey", "X-Api-Key")
    );
    assert_eq!(secret.env_var.as_deref(), Some("CREATEOS_API_KEY"));
    assert!(description
        .capabilities
        .contains(Capabilities::REUSABLE_LEASES));
    assert!(description.capabilities.contains(Capabilities::NATIVE_SYNC));
    // Terminals and pipes over managed processes (contract 0.6.0); no
    // resize, which the service lacks.
    assert!(description.capabilities.contains(Capabilities::LOGIN_PTY));
    assert!(description
        .capabilities
        .contains(Capabilities::DUPLEX_CHANNELS));
    assert!(!description
        .capabilities
        .contains(Capabilities::TERMINAL_RESIZE));
    let schema: serde_json::Value = serde_json::from_str(&description.config_schema).unwrap();
    assert_eq!(schema["type"], "object");
    assert!(schema["properties"]["apiUrl"].is_object());
}

#[test]
fn validate_config_normalises_and_names_the_origin() {
    let validation = Fake::new()
        .instance()
        .validate_config(
            &json!({"apiUrl": "https://API.createos.test/v1/", "apiKey": {"ref": "k"}}).to_string(),
        )
        .unwrap();
    assert!(validation.ok, "{validation:?}");
    assert_eq!(validation.api_origins, vec![API_URL.to_string()]);
    let budget = validation
        .budget
        .expect("a valid config declares its budget");
    assert_eq!((budget.operation_ms, budget.request_ms), (300_000, 30_000));
    let normalized: serde_json::Value =
        serde_json::from_str(validation.normalized_config.as_deref().unwrap()).unwrap();
    assert_eq!(normalized["apiUrl"], API_URL);
    assert_eq!(
        normalized["apiKey"],
        json!({"ref": "k"}),
        "secret references stay as given"
    );
}

#[test]
fn unsafe_api_urls_are_rejected_before_any_request() {
    for url in [
        "http://api.createos.test",
        "https://user:SECRET-BODY-TEXT@api.createos.test",
        "https://api.createos.test/v1?key=SECRET-BODY-TEXT",
        "https://api.createos.test/other",
        "file:///etc/passwd",
    ] {
        let fake = Fake::new();
        let validation = fake
            .instance()
            .validate_config(&json!({"apiUrl": url}).to_string())
            .unwrap();
        assert!(!validation.ok && validation.api_origins.is_empty(), "{url}");
        assert_no_body(&validation);
        let ctx = ctx_with(json!({"apiUrl": url}).to_string());
        let error = fake
            .instance()
            .execute(&ctx, &lease(), &command("ls", &[]))
            .unwrap()
            .unwrap_err();
        assert!(
            matches!(error, ProviderError::InvalidConfig(_)),
            "{error:?}"
        );
        assert_no_body(&error);
        assert!(fake.calls().is_empty());
    }
}

#[test]
fn a_lease_from_another_environment_is_refused_without_requests() {
    let fake = Fake::new();
    let mut other = ctx();
    other.environment_id = "env-2".into();
    let error = fake
        .instance()
        .execute(&other, &lease(), &command("ls", &[]))
        .unwrap()
        .unwrap_err();
    assert!(matches!(error, ProviderError::ForeignLease(_)), "{error:?}");
    let mut garbage = lease();
    garbage.metadata = "{]".into();
    let error = fake
        .instance()
        .destroy_lease(&ctx(), &garbage)
        .unwrap()
        .unwrap_err();
    assert!(matches!(error, ProviderError::ForeignLease(_)), "{error:?}");
    assert!(fake.calls().is_empty());
}
