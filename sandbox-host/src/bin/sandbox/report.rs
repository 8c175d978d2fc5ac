//! Printing results for people (text) and programs (`--json`).

use sandbox_host::types::{
    Capabilities, ConfigValidation, EgressPolicy, PortEndpoint, ProbeReport, ProviderDescription,
    ProviderError, TemplateDeletion, TemplateInfo, TerminationReceipt,
};
use sandbox_host::{action_name, LeaseRecord, LeaseState};
use serde_json::{json, Value};

use crate::{EXIT_CLEANUP_FAILED, EXIT_SANDBOX_ERROR};

/// One line about a provider error, for people.
pub fn error_text(error: &ProviderError) -> String {
    sandbox_host::error_text(error)
}

fn print_json(value: &Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).unwrap_or_default()
    );
}

pub fn description(d: &ProviderDescription, as_json: bool) {
    let capabilities: Vec<&str> = [
        (Capabilities::REUSABLE_LEASES, "reusable-leases"),
        (Capabilities::INCREMENTAL_OUTPUT, "incremental-output"),
        (Capabilities::NATIVE_SYNC, "native-sync"),
        (Capabilities::LOGIN_PTY, "login-pty"),
        (Capabilities::DUPLEX_CHANNELS, "duplex-channels"),
        (Capabilities::TERMINAL_RESIZE, "terminal-resize"),
    ]
    .into_iter()
    .filter(|(flag, _)| d.capabilities.contains(*flag))
    .map(|(_, name)| name)
    .chain(
        sandbox_host::policy_capabilities(d.capabilities)
            .into_iter()
            .filter(|(_, claimed)| *claimed)
            .map(|(name, _)| name),
    )
    .collect();
    if as_json {
        let schema: Value = serde_json::from_str(&d.config_schema).unwrap_or(Value::Null);
        print_json(&json!({
            "driverKey": d.driver_key,
            "displayName": d.display_name,
            "configSchema": schema,
            "capabilities": capabilities,
            "secrets": d.secrets.iter().map(|s| json!({
                "configField": s.config_field, "header": s.header, "scheme": s.scheme,
                "envVar": s.env_var,
            })).collect::<Vec<_>>(),
            "originFields": d.origin_fields.iter().map(|o| json!({
                "configField": o.config_field, "defaultUrl": o.default_url, "secrets": o.secrets,
            })).collect::<Vec<_>>(),
            "rateLimit": d.rate_limit.map(|l| json!({
                "requests": l.requests, "windowMs": l.window_ms, "perSecond": l.per_second,
            })),
        }));
        return;
    }
    println!("{} ({})", d.display_name, d.driver_key);
    println!("capabilities: {}", capabilities.join(", "));
    // The environment policy of contract 0.7.0, each part said either way.
    let policy: Vec<String> = sandbox_host::policy_capabilities(d.capabilities)
        .into_iter()
        .map(|(name, claimed)| format!("{name} {}", if claimed { "yes" } else { "no" }))
        .collect();
    println!("environment policy: {}", policy.join(", "));
    for s in &d.secrets {
        // Only a variable this CLI itself reads is named; a provider's
        // declared `env-var` is never read by the host.
        let env = sandbox_host::Secrets::cli_key_variable(&d.driver_key)
            .filter(|_| s.config_field == "apiKey")
            .map(|v| format!(", or ${v}"))
            .unwrap_or_default();
        let scheme = s
            .scheme
            .as_deref()
            .map(|w| format!(" ({w} <secret>)"))
            .unwrap_or_default();
        println!(
            "secret: config field {} sent as {}{scheme}{env}",
            s.config_field, s.header
        );
    }
    for o in &d.origin_fields {
        let default = o
            .default_url
            .as_deref()
            .map(|u| format!(" (default {u})"))
            .unwrap_or_else(|| " (required)".to_owned());
        let secrets = if o.secrets.is_empty() {
            "no secret".to_owned()
        } else {
            format!("receives {}", o.secrets.join(", "))
        };
        println!(
            "api origin: config field {}{default}, {secrets}",
            o.config_field
        );
    }
    match d.rate_limit {
        Some(l) => {
            let per_second = l
                .per_second
                .map(|cap| format!(", at most {cap} per second"))
                .unwrap_or_default();
            println!(
                "rate limit: {} requests per {} ms{per_second}",
                l.requests, l.window_ms
            );
        }
        None => println!("rate limit: none declared"),
    }
    config_schema(&d.config_schema);
}

/// The config fields of a JSON Schema, one line each.
fn config_schema(schema: &str) {
    let Ok(schema) = serde_json::from_str::<Value>(schema) else {
        println!("config schema: not valid JSON");
        return;
    };
    println!("config fields:");
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
        return;
    };
    for (name, field) in properties {
        let kind = field.get("type").and_then(Value::as_str).unwrap_or("any");
        let default = field
            .get("default")
            .map(|d| format!(", default {d}"))
            .unwrap_or_default();
        let about = field
            .get("description")
            .and_then(Value::as_str)
            .map(|d| format!(": {d}"))
            .unwrap_or_default();
        println!("  {name} ({kind}{default}){about}");
    }
}

pub fn validation(v: &ConfigValidation, as_json: bool) {
    if as_json {
        let normalized = v
            .normalized_config
            .as_deref()
            .and_then(|c| serde_json::from_str::<Value>(c).ok());
        print_json(&json!({
            "ok": v.ok, "warnings": v.warnings, "errors": v.errors,
            "normalizedConfig": normalized, "apiOrigins": v.api_origins,
        }));
        return;
    }
    println!("{}", if v.ok { "config ok" } else { "config invalid" });
    for e in &v.errors {
        println!("error: {e}");
    }
    for w in &v.warnings {
        println!("warning: {w}");
    }
    for origin in &v.api_origins {
        println!("api origin: {origin}");
    }
}

pub fn probe(outcome: &Result<ProbeReport, ProviderError>, as_json: bool) -> u8 {
    match outcome {
        Ok(report) => {
            if as_json {
                print_json(&json!({
                    "ok": report.ok, "summary": report.summary, "diagnostics": report.diagnostics,
                }));
            } else {
                println!("{}", report.summary);
                for line in &report.diagnostics {
                    println!("  {line}");
                }
            }
            if report.ok {
                0
            } else {
                1
            }
        }
        Err(error) => {
            if as_json {
                print_json(&json!({ "ok": false, "error": error_text(error) }));
            }
            eprintln!("sandbox: probe failed: {}", error_text(error));
            if let ProviderError::CleanupFailed(failure) = error {
                match &failure.sandbox_id {
                    Some(_) => eprintln!(
                        "sandbox: the sandbox is recorded as poisoned; `sandbox lease sweep` destroys it"
                    ),
                    None => eprintln!(
                        "sandbox: no id is known to delete it by; look for it in the provider's \
                         console (`sandbox lease list` shows the probe as unknown)"
                    ),
                }
            }
            exit_for(error)
        }
    }
}

pub fn termination(
    verb: &str,
    lease: &str,
    outcome: &Result<TerminationReceipt, ProviderError>,
    as_json: bool,
) -> u8 {
    match outcome {
        Ok(receipt) => {
            if as_json {
                print_json(&json!({
                    "lease": lease, "sandboxId": receipt.sandbox_id,
                    "action": action_name(receipt.action),
                }));
            } else {
                println!(
                    "{verb} {lease} (sandbox {}: {})",
                    receipt.sandbox_id,
                    action_name(receipt.action)
                );
            }
            0
        }
        Err(error) => {
            eprintln!("sandbox: {lease}: {}", error_text(error));
            if let ProviderError::CleanupFailed(_) = error {
                eprintln!(
                    "sandbox: the lease is poisoned; `sandbox lease destroy {lease}` tries again, \
                     `sandbox lease sweep` destroys every poisoned lease"
                );
            }
            exit_for(error)
        }
    }
}

/// A provider error on stderr (`what` names the lease or template) and the
/// exit status it gives.
pub fn failed(what: &str, error: &ProviderError) -> u8 {
    eprintln!("sandbox: {what}: {}", error_text(error));
    if let ProviderError::CleanupFailed(_) = error {
        eprintln!(
            "sandbox: the lease is poisoned; `sandbox lease destroy LEASE` destroys it, \
             `sandbox lease sweep` destroys every poisoned lease"
        );
    }
    exit_for(error)
}

/// `lease egress`: the policy now in force.
pub fn egress_set(
    lease: &str,
    policy: &EgressPolicy,
    outcome: &Result<LeaseRecord, ProviderError>,
    as_json: bool,
) -> u8 {
    match outcome {
        Ok(record) => {
            if as_json {
                let mut value = lease_json(record);
                value["egress"] = egress_json(policy);
                print_json(&value);
            } else {
                println!(
                    "lease {lease}: egress now {}",
                    crate::egress_policy::text(policy)
                );
            }
            0
        }
        Err(error) => failed(&format!("lease {lease}"), error),
    }
}

fn egress_json(policy: &EgressPolicy) -> Value {
    match policy {
        EgressPolicy::BlockAll => json!("none"),
        EgressPolicy::Unrestricted => json!("*"),
        EgressPolicy::Allow(entries) => json!(entries),
    }
}

/// `lease port`: the URL, and the headers to send with every request.
/// Their values are secrets of the sandbox: they go to stdout (for the
/// caller), never to a log; stderr says so.
pub fn port_opened(
    lease: &str,
    outcome: &Result<PortEndpoint, ProviderError>,
    as_json: bool,
) -> u8 {
    match outcome {
        Ok(endpoint) => {
            if as_json {
                print_json(&json!({
                    "lease": lease, "port": endpoint.port, "url": endpoint.url,
                    "headers": endpoint.headers.iter()
                        .map(|(name, value)| json!({ "name": name, "value": value }))
                        .collect::<Vec<_>>(),
                }));
            } else {
                println!("url: {}", endpoint.url);
                for (name, value) in &endpoint.headers {
                    println!("header: {name}: {value}");
                }
            }
            if endpoint.headers.is_empty() {
                eprintln!(
                    "sandbox: port {} of lease {lease} is public: anyone who has the URL reaches it",
                    endpoint.port
                );
            } else {
                eprintln!(
                    "sandbox: send the header(s) above with every request to the URL; their \
                     values are secrets: give them only to whoever the port is for, never log them"
                );
            }
            0
        }
        Err(error) => {
            let code = failed(&format!("lease {lease}"), error);
            if let ProviderError::ApiRejected(rejection) = error {
                if rejection.status == 403 {
                    eprintln!(
                        "sandbox: the service refuses to open ports (ingress off?); the \
                         embedded engine opens them when started with `sandbox engine --ingress`"
                    );
                }
            }
            code
        }
    }
}

fn template_json(t: &TemplateInfo) -> Value {
    json!({ "name": t.name, "templateRef": t.template_ref, "createdAt": t.created_at })
}

/// `template create`: the template's reference, then the lease's release.
pub fn template_captured(
    lease: &str,
    template: &TemplateInfo,
    released: &Result<TerminationReceipt, ProviderError>,
    as_json: bool,
) -> u8 {
    if as_json {
        let mut value = template_json(template);
        value["lease"] = json!(lease);
        value["released"] = match released {
            Ok(receipt) => json!(action_name(receipt.action)),
            Err(error) => json!({ "error": error_text(error) }),
        };
        print_json(&value);
    } else {
        println!("{}", template.template_ref);
        eprintln!(
            "sandbox: template {} captured from lease {lease}",
            template.name
        );
    }
    match released {
        Ok(receipt) => {
            if !as_json {
                eprintln!(
                    "sandbox: released {lease} (sandbox {}: {})",
                    receipt.sandbox_id,
                    action_name(receipt.action)
                );
            }
            0
        }
        Err(error) => failed(
            &format!("the template is kept, but releasing lease {lease} failed"),
            error,
        ),
    }
}

/// `template list`.
pub fn templates(outcome: &Result<Vec<TemplateInfo>, ProviderError>, as_json: bool) -> u8 {
    match outcome {
        Ok(templates) => {
            if as_json {
                print_json(&Value::Array(templates.iter().map(template_json).collect()));
            } else if templates.is_empty() {
                println!("no templates");
            } else {
                for t in templates {
                    println!(
                        "{}  {}  {}",
                        t.name,
                        t.template_ref,
                        t.created_at.as_deref().unwrap_or("-")
                    );
                }
            }
            0
        }
        Err(error) => failed("listing templates", error),
    }
}

/// `template delete`.
pub fn template_deleted(
    template_ref: &str,
    outcome: &Result<TemplateDeletion, ProviderError>,
    as_json: bool,
) -> u8 {
    match outcome {
        Ok(deletion) => {
            let what = match deletion {
                TemplateDeletion::Deleted => "deleted",
                TemplateDeletion::AlreadyGone => "already gone",
            };
            if as_json {
                print_json(&json!({ "templateRef": template_ref, "deletion": what }));
            } else {
                println!("template {template_ref}: {what}");
            }
            0
        }
        Err(error) => failed(&format!("template {template_ref}"), error),
    }
}

fn exit_for(error: &ProviderError) -> u8 {
    match error {
        ProviderError::CleanupFailed(_) => EXIT_CLEANUP_FAILED,
        _ => EXIT_SANDBOX_ERROR,
    }
}

fn lease_json(r: &LeaseRecord) -> Value {
    json!({
        "id": r.id, "provider": r.provider, "companyId": r.company_id,
        "environmentId": r.environment_id, "runId": r.run_id, "state": r.state.as_str(),
        "reason": r.reason,
        "providerLeaseId": r.lease.as_ref().map(|l| l.provider_lease_id.clone()),
        "expiresAt": r.lease.as_ref().and_then(|l| l.expires_at.clone()),
        "createdMs": r.created_ms, "updatedMs": r.updated_ms,
        "busyOwner": r.busy_owner, "closingOwner": r.closing_owner,
    })
}

pub fn lease_acquired(r: &LeaseRecord, as_json: bool) {
    if as_json {
        print_json(&lease_json(r));
    } else {
        println!("{}", r.id);
    }
}

pub fn leases(records: &[LeaseRecord], as_json: bool) {
    if as_json {
        print_json(&Value::Array(records.iter().map(lease_json).collect()));
        return;
    }
    if records.is_empty() {
        println!("no leases");
        return;
    }
    for r in records {
        let sandbox = r
            .lease
            .as_ref()
            .map_or("-", |l| l.provider_lease_id.as_str());
        let mut reason = match (r.state, &r.reason) {
            (LeaseState::Active, _) | (_, None) => String::new(),
            (_, Some(reason)) => format!("  ({reason})"),
        };
        if let Some(owner) = r.busy_owner.as_ref().or(r.closing_owner.as_ref()) {
            reason.push_str(&format!("  [in use by host instance {owner}]"));
        }
        println!(
            "{}  {:<9}  {}  {}/{}  sandbox {sandbox}{reason}",
            r.id, r.state, r.provider, r.company_id, r.environment_id
        );
    }
}

pub fn swept(results: &[(LeaseRecord, Result<(), String>)], as_json: bool) {
    if as_json {
        print_json(&Value::Array(
            results
                .iter()
                .map(|(r, outcome)| {
                    let mut value = lease_json(r);
                    value["swept"] = json!(outcome.is_ok());
                    if let Err(e) = outcome {
                        value["error"] = json!(e);
                    }
                    value
                })
                .collect(),
        ));
        return;
    }
    if results.is_empty() {
        println!("nothing to sweep");
    }
    for (r, outcome) in results {
        match outcome {
            Ok(()) => println!("{}: destroyed", r.id),
            Err(e) => println!("{}: {} ({e})", r.id, r.state),
        }
    }
}
