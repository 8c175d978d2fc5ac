//! The shared secret-routing table (`node/test/scenarios/secret-routing.json`,
//! issue 26 "one policy, two hosts"; the rules in `docs/secret-routing.md`),
//! run through the Rust host's real decisions: [`Secrets::split`] and the
//! runtime's `route_policy`. The Node host runs the same table through
//! `splitConfig` and `checkAskedOrigins` (`node/test/secret-routing.test.mjs`).
//! Test-only; it lives beside `lib.rs` because it crosses the network rules
//! and the contract's types, which `network/` does not import.

use serde_json::Value;

use crate::network::policy::Origin;
use crate::network::secrets::Secrets;
use crate::wasm::bindings::types::ProviderDescription;

/// A provider description of the shared secret-routing table (the
/// Node host's camelCase shape of `describe()`).
fn described(value: &Value) -> ProviderDescription {
    use crate::wasm::bindings::types::{Capabilities, OriginField, SecretField};
    let text = |v: &Value| v.as_str().map(str::to_owned);
    ProviderDescription {
        driver_key: text(&value["driverKey"]).unwrap(),
        display_name: text(&value["displayName"]).unwrap(),
        config_schema: text(&value["configSchema"]).unwrap(),
        capabilities: Capabilities::empty(),
        secrets: value["secrets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| SecretField {
                config_field: text(&s["configField"]).unwrap(),
                header: text(&s["header"]).unwrap(),
                scheme: text(&s["scheme"]),
                env_var: text(&s["envVar"]),
            })
            .collect(),
        origin_fields: value["originFields"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| OriginField {
                config_field: text(&o["configField"]).unwrap(),
                default_url: text(&o["defaultUrl"]),
                secrets: o["secrets"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|s| text(s).unwrap())
                    .collect(),
            })
            .collect(),
        rate_limit: None,
    }
}

/// The operator's settings of a case (`operators` in the shared table):
/// the origins trusted (as [`Secrets::trust_default_origin`]), and per
/// secret field the variable named, its key scoped to those origins (as
/// the `sandbox` CLI's own defaults). The variable a provider declares
/// (`env-var`) is not among them: no host reads it.
fn operator_of(value: &Value) -> Secrets {
    let mut secrets = Secrets::none();
    for origin in value["trustedOrigins"].as_array().into_iter().flatten() {
        secrets = secrets
            .trust_default_origin(origin.as_str().unwrap())
            .unwrap();
    }
    for (field, var) in value["secretEnv"].as_object().into_iter().flatten() {
        secrets = secrets.with_env_for_trusted(field, var.as_str().unwrap());
    }
    secrets
}

/// A route's secret headers in the table (`header`/`value`, or
/// `secrets`), names lower-case (`http` keeps them so), sorted.
fn expected_headers(route: &Value) -> Vec<(String, String)> {
    let one = |s: &Value| {
        (
            s["header"].as_str().unwrap().to_ascii_lowercase(),
            s["value"].as_str().unwrap().to_owned(),
        )
    };
    let mut headers: Vec<_> = match route["secrets"].as_array() {
        Some(list) => list.iter().map(one).collect(),
        None if route["header"].is_string() => vec![one(route)],
        None => Vec::new(),
    };
    headers.sort();
    headers
}

/// The shared secret-routing table
/// (`node/test/scenarios/secret-routing.json`, run by the Node host's
/// `splitConfig` and `checkAskedOrigins` too): which origin receives
/// which secret in which header, decided by [`Secrets::split`] and the
/// runtime's `route_policy`.
#[test]
fn shared_decisions_secret_routing() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../node/test/scenarios/secret-routing.json");
    let table: Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("the shared table"))
            .expect("the shared table is JSON");
    let cases = table["cases"].as_array().unwrap();
    assert!(cases.len() >= 36, "the shared table lost cases");
    let mut wrong = Vec::new();
    for case in cases {
        let name = &case["name"];
        let description = described(&table["providers"][case["provider"].as_str().unwrap()]);
        let operator = case["operator"].as_str().unwrap_or("none");
        let secrets = operator_of(&table["operators"][operator]);
        if let Some(env) = case["env"].as_object() {
            for (var, value) in env {
                std::env::set_var(var, value.as_str().unwrap());
            }
        }
        let decision = secrets
            .split(&case["config"].to_string(), &description)
            .and_then(|split| {
                let asked: Vec<String> = match case["asked"].as_array() {
                    Some(asked) => asked.iter().map(|a| a.as_str().unwrap().into()).collect(),
                    None => split.origins.iter().map(|o| o.origin.to_string()).collect(),
                };
                let policy = crate::runtime::origin_policy::route_policy(
                    &description,
                    &split,
                    &secrets,
                    &asked,
                )?;
                let headers = policy.secret_headers();
                Ok(split
                    .origins
                    .iter()
                    .map(|o| {
                        let mut secrets: Vec<_> = headers
                            .iter()
                            .filter(|(origin, _, _)| origin == &o.origin)
                            .map(|(_, header, value)| (header.clone(), value.clone()))
                            .collect();
                        secrets.sort();
                        (o.field.clone(), o.origin.clone(), secrets)
                    })
                    .collect::<Vec<_>>())
            });
        if let Some(env) = case["env"].as_object() {
            for var in env.keys() {
                std::env::remove_var(var);
            }
        }
        if case["expect"]["refused"] == true {
            match decision {
                Ok(routes) => wrong.push(format!("{name}: expected a refusal, got {routes:?}")),
                Err(error) => {
                    let why = format!("{error:#}");
                    for word in case["expect"]["mentions"].as_array().into_iter().flatten() {
                        let word = word.as_str().unwrap();
                        if !why.contains(word) {
                            wrong.push(format!("{name}: the refusal does not name {word}: {why}"));
                        }
                    }
                }
            }
            continue;
        }
        let routes = match decision {
            Ok(routes) => routes,
            Err(error) => {
                wrong.push(format!("{name}: refused: {error:#}"));
                continue;
            }
        };
        let expected: Vec<_> = case["expect"]["routes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                let uri: http::Uri = r["origin"].as_str().unwrap().parse().unwrap();
                (
                    r["field"].as_str().unwrap().to_owned(),
                    Origin::of_uri(&uri).unwrap(),
                    expected_headers(r),
                )
            })
            .collect();
        if routes != expected {
            wrong.push(format!("{name}: got {routes:?}, expected {expected:?}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "cases decided otherwise:\n{}",
        wrong.join("\n")
    );
}
