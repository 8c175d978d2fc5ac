//! The README's "Write your own provider" example, for a made-up API:
//! `POST /sandboxes` → `{"id"}`; `POST /sandboxes/{id}/run {"script"}` →
//! `{"exitCode","stdout","stderr"}` once its process tree is gone;
//! `DELETE /sandboxes/{id}` → 204 (404 when gone).

use provider_sdk::config::{ConfigObject, ProviderConfig, Validation};
use provider_sdk::errors::{cleanup_cause, cleanup_failed, deletion_receipt, ApiError};
use provider_sdk::http::{call_json, is_valid_id};
use provider_sdk::origin::normalize_url;
use provider_sdk::output::result_text;
use provider_sdk::platform::{Method, Request, Wait};
use provider_sdk::types::*;
use provider_sdk::{script, Operation, Provider};
use serde_json::{json, Value};

/// One operation: the SDK has parsed the config and points requests at its origin.
pub struct Minimal<'a>(Operation<'a, Config>);
provider_sdk::export_provider!(Minimal);

/// `{"apiUrl": "https://...", "apiKey": <secret, injected by the host>}`.
pub struct Config {
    origin: String,
}

impl ProviderConfig for Config {
    fn validate(json: &str) -> Validation<Config> {
        let mut object = ConfigObject::parse(json, &["apiUrl", "apiKey"]);
        let url = object.string("apiUrl").unwrap_or_default();
        let origin = normalize_url(&url, &["", "/"]).unwrap_or_else(|e| {
            object.error(format!("apiUrl: {e}"));
            String::new()
        });
        let normalized = json!({ "apiUrl": origin });
        object.finish(Config { origin }, normalized, "apiKey")
    }

    /// Requests go here (the SDK points the platform at it).
    fn api_origins(&self) -> Vec<String> {
        vec![self.origin.clone()]
    }
    // No `budget`: the host's defaults, longer than any 60 s request here.
}

impl Minimal<'_> {
    /// One JSON call with a deadline.
    fn call(&mut self, request: Request) -> Result<Value, ApiError> {
        let wait = Wait::from_now(self.0.platform, 60_000, false);
        call_json(self.0.platform, &request, wait)
    }
}

impl<'a> Provider<'a> for Minimal<'a> {
    type Config = Config;

    fn new(op: Operation<'a, Config>) -> Self {
        Minimal(op)
    }

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

    fn acquire_lease(&mut self, _: &AcquireRequest) -> Result<Lease, ProviderError> {
        let create = Request::new(Method::Post, "/sandboxes").with_json(&json!({}));
        // A creation that may have happened, with no id to delete it by, says so.
        let answer = self
            .call(create)
            .map_err(|e| e.into_creation_error("create", None, CleanupPhase::LeaseSetup))?;
        let Some(id) = answer["id"].as_str().filter(|id| is_valid_id(id)) else {
            let cause = CleanupCause::InvalidResponse("no valid sandbox id".into());
            return Err(cleanup_failed(None, CleanupPhase::LeaseSetup, cause));
        };
        self.0.platform.record_sandbox(id);
        Ok(Lease {
            provider_lease_id: id.into(),
            metadata: "{}".into(),
            expires_at: None,
        })
    }

    /// `release-lease` defaults to this: a sandbox that is not reusable is deleted.
    fn destroy_lease(&mut self, lease: &Lease) -> Result<TerminationReceipt, ProviderError> {
        let id = &lease.provider_lease_id;
        let delete = Request::new(Method::Delete, format!("/sandboxes/{id}"));
        let deleted = match self.call(delete) {
            Ok(_) => Ok(TerminationAction::Deleted),
            Err(ApiError::Status(404)) => Ok(TerminationAction::AlreadyGone),
            Err(e) => Err(cleanup_cause(e)),
        };
        deletion_receipt(id, deleted) // unconfirmed: cleanup-failed
    }

    /// The SDK has validated `request` (`script::validate`).
    fn execute(
        &mut self,
        lease: &Lease,
        request: &ExecuteRequest,
    ) -> Result<ExecuteResult, ProviderError> {
        let body = json!({ "script": script::build(request, None) });
        let run = format!("/sandboxes/{}/run", lease.provider_lease_id);
        // A run that may have started is not confirmed gone: cleanup-failed.
        let id = Some(lease.provider_lease_id.as_str());
        let answer = self
            .call(Request::new(Method::Post, run).with_json(&body))
            .map_err(|e| e.into_creation_error("run", id, CleanupPhase::ProcessCreation))?;
        // The last characters the request asks for (4 Mi unless it says).
        let text = |name| {
            result_text(
                answer[name].as_str().unwrap_or_default(),
                request.result_chars,
            )
        };
        let ((stdout, cut_out), (stderr, cut_err)) = (text("stdout"), text("stderr"));
        Ok(ExecuteResult {
            exit_code: answer["exitCode"].as_i64().map(|c| c as i32),
            signal: None,
            timed_out: false,
            stdout,
            stderr,
            process_id: String::new(),
            output_truncated: cut_out || cut_err,
        })
    }
}
