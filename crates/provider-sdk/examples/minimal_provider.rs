//! The README's "Write your own provider" example, for a made-up API:
//! `POST /sandboxes` → `{"id"}`; `POST /sandboxes/{id}/run {"script"}` →
//! `{"exitCode","stdout","stderr"}` once its process tree is gone;
//! `DELETE /sandboxes/{id}` → 204 (404 when gone).

use provider_sdk::errors::{cleanup_cause, cleanup_failed, is_valid_id, ApiError};
use provider_sdk::origin::{normalize_url, Origin};
use provider_sdk::platform::{Method, Platform, Request, Wait};
use provider_sdk::types::*;
use provider_sdk::{script, Provider};
use serde_json::{json, Value};

pub struct Minimal;
provider_sdk::export_provider!(Minimal);

fn origin(config: &str) -> Result<String, String> {
    let config: Value = serde_json::from_str(config).map_err(|_| "config is not JSON")?;
    let url = config["apiUrl"].as_str().ok_or("apiUrl: required")?;
    normalize_url(url, &["", "/"]).map_err(|e| format!("apiUrl: {e}"))
}

/// Points the platform at the config's origin; one JSON call with a deadline.
fn call(p: &mut dyn Platform, ctx: &EnvironmentContext, req: Request) -> Result<Value, ApiError> {
    let origin = origin(&ctx.config).map_err(ApiError::Invalid)?;
    p.set_default_origin(Origin::parse(&origin).ok_or(ApiError::Invalid("origin".into()))?);
    let wait = Wait::from_now(p, 60_000, false);
    let answer = p.send(&req, wait, 8 << 20).map_err(ApiError::Transport)?;
    match answer.status {
        200..=299 if answer.body.is_empty() => Ok(Value::Null),
        200..=299 => {
            serde_json::from_slice(&answer.body).map_err(|_| ApiError::Invalid("not JSON".into()))
        }
        status => Err(ApiError::Status(status)),
    }
}

fn json_request(method: Method, path: String, body: Value) -> Request {
    Request::new(method, path).with_body("application/json", body.to_string().into_bytes())
}

impl Provider for Minimal {
    fn describe() -> ProviderDescription {
        ProviderDescription {
            driver_key: "minimal".into(),
            display_name: "Minimal".into(),
            config_schema: json!({"type": "object", "required": ["apiUrl"]}).to_string(),
            capabilities: Capabilities::empty(),
            secrets: vec![SecretField {
                config_field: "apiKey".into(),
                header: "Authorization".into(),
                scheme: Some("Bearer".into()),
                env_var: None,
            }],
            origin_fields: vec![OriginField {
                config_field: "apiUrl".into(),
                default_url: None,
                secrets: vec!["apiKey".into()],
            }],
            rate_limit: None,
        }
    }

    fn validate_config(config: &str) -> ConfigValidation {
        let origin = origin(config);
        ConfigValidation {
            ok: origin.is_ok(),
            warnings: vec![],
            errors: origin.clone().err().into_iter().collect(),
            normalized_config: origin.as_ref().ok().map(|_| config.to_string()),
            api_origins: origin.into_iter().collect(),
            budget: None, // the host's defaults: longer than any 60 s request here
        }
    }

    fn acquire_lease(
        p: &mut dyn Platform,
        ctx: &EnvironmentContext,
        _: &AcquireRequest,
    ) -> Result<Lease, ProviderError> {
        let create = json_request(Method::Post, "/sandboxes".into(), json!({}));
        // A creation that may have happened, with no id to delete it by, says so.
        let answer = call(p, ctx, create)
            .map_err(|e| e.into_creation_error("create", None, CleanupPhase::LeaseSetup))?;
        let Some(id) = answer["id"].as_str().filter(|id| is_valid_id(id)) else {
            let cause = CleanupCause::InvalidResponse("no valid sandbox id".into());
            return Err(cleanup_failed(None, CleanupPhase::LeaseSetup, cause));
        };
        let id = id.to_string();
        p.record_sandbox(&id);
        Ok(Lease {
            provider_lease_id: id,
            metadata: "{}".into(),
            expires_at: None,
        })
    }

    /// `release-lease` defaults to this: a sandbox that is not reusable is deleted.
    fn destroy_lease(
        p: &mut dyn Platform,
        ctx: &EnvironmentContext,
        lease: &Lease,
    ) -> Result<TerminationReceipt, ProviderError> {
        let id = &lease.provider_lease_id;
        let action = match call(
            p,
            ctx,
            Request::new(Method::Delete, format!("/sandboxes/{id}")),
        ) {
            Ok(_) => TerminationAction::Deleted,
            Err(ApiError::Status(404)) => TerminationAction::AlreadyGone,
            Err(e) => {
                let cause = cleanup_cause(e);
                return Err(cleanup_failed(
                    Some(id),
                    CleanupPhase::SandboxDeletion,
                    cause,
                ));
            }
        };
        let sandbox_id = id.clone();
        Ok(TerminationReceipt { sandbox_id, action })
    }

    fn execute(
        p: &mut dyn Platform,
        ctx: &EnvironmentContext,
        lease: &Lease,
        request: &ExecuteRequest,
    ) -> Result<ExecuteResult, ProviderError> {
        script::validate(request).map_err(|e| ProviderError::InvalidRequest(e.0))?;
        let body = json!({ "script": script::build(request, None) });
        let path = format!("/sandboxes/{}/run", lease.provider_lease_id);
        // A run that may have started is not confirmed gone: cleanup-failed.
        let id = Some(lease.provider_lease_id.as_str());
        let answer = call(p, ctx, json_request(Method::Post, path, body))
            .map_err(|e| e.into_creation_error("run", id, CleanupPhase::ProcessCreation))?;
        Ok(ExecuteResult {
            exit_code: answer["exitCode"].as_i64().map(|c| c as i32),
            signal: None,
            timed_out: false,
            stdout: answer["stdout"].as_str().unwrap_or_default().into(),
            stderr: answer["stderr"].as_str().unwrap_or_default().into(),
            process_id: String::new(),
            output_truncated: false,
        })
    }
}
