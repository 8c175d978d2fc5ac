//! The key stays in the host: the backend receives it (a wrong key is
//! rejected, the right one accepted), and it appears nowhere the component
//! or a user could see it: the component's config, the lease store, the
//! sandbox's environment, command output, error texts.

use std::collections::BTreeSet;

use anyhow::{bail, ensure, Result};
use sandbox_host::types::{ExecuteRequest, ProviderError};
use sandbox_host::{error_text, CancelToken};
use serde_json::Value;

use crate::command::{cmd, outcome_text};
use crate::procs::unique_marker;
use crate::scenarios::{succeeded, with_session};
use crate::session::Session;
use crate::target::Target;
use crate::verdict::Verdict;

/// The secret config fields of the session's provider (those it declares,
/// and `apiKey`, which the host always treats as secret) with the value
/// each holds in the config: the secret itself, or what an `env` or `file`
/// reference names.
fn secrets(session: &Session) -> Vec<(String, String)> {
    let mut fields: BTreeSet<String> = session
        .runtime()
        .description()
        .secrets
        .iter()
        .map(|s| s.config_field.clone())
        .collect();
    fields.insert("apiKey".into());
    fields
        .into_iter()
        .filter_map(|field| {
            let value = match session.config().get(&field)? {
                Value::String(secret) => secret.clone(),
                Value::Object(reference) => match (reference.get("env"), reference.get("file")) {
                    (Some(Value::String(var)), _) => std::env::var(var).ok()?,
                    (_, Some(Value::String(path))) => std::fs::read_to_string(path)
                        .ok()?
                        .trim_end_matches(['\n', '\r'])
                        .to_owned(),
                    _ => return None,
                },
                _ => return None,
            };
            (!value.is_empty()).then_some((field, value))
        })
        .collect()
}

/// Fails when `text` (what `what` names) contains any of `secrets`.
fn clean(what: &str, text: &str, secrets: &[(String, String)]) -> Result<()> {
    for (field, secret) in secrets {
        ensure!(
            !text.contains(secret.as_str()),
            "the secret of config field {field} is visible in {what}"
        );
    }
    Ok(())
}

/// The key reaches the backend and nowhere else.
pub fn never_visible(target: &Target) -> Result<Verdict> {
    with_session(target, None, |s| {
        let secrets = secrets(s);
        if secrets.is_empty() {
            return Ok(Verdict::NotApplicable(
                "the config holds no secret in a secret field".into(),
            ));
        }
        clean(
            "the config the component gets",
            &s.env().context().config,
            &secrets,
        )?;
        clean(
            "what validate-config answered",
            &format!("{:?}", s.env().validation()),
            &secrets,
        )?;

        // The backend receives it: the right key works...
        let lease = s.acquire()?;
        let id = &lease.id;
        // ... and a wrong one is rejected, so the backend did check it.
        let mut wrong = s.config().clone();
        let wrong_key = format!("kitwrongkey{}", unique_marker());
        for (field, _) in &secrets {
            wrong[field.as_str()] = Value::String(wrong_key.clone());
        }
        let wrong_env = s.environment_for(&wrong)?;
        match s.try_acquire(&wrong_env, "conformance-wrong-key")? {
            Err(ProviderError::ApiRejected(rejection)) if matches!(rejection.status, 401 | 403) => {
                let text = error_text(&ProviderError::ApiRejected(rejection));
                clean("the wrong key's rejection", &text, &secrets)?;
                ensure!(
                    !text.contains(&wrong_key),
                    "the wrong key is visible in its rejection: {text}"
                );
            }
            Err(error) => bail!(
                "acquire with a wrong key: expected a 401 or 403 rejection, got {}",
                error_text(&error)
            ),
            Ok(record) => bail!(
                "acquire with a wrong key succeeded (lease {}): the backend does not check the \
                 key, so the scenario cannot prove it received it",
                record.id
            ),
        }

        // Inside the sandbox: not in the environment of a command.
        let env = succeeded(
            "env",
            s.execute(id, &cmd("env", &[]), None, CancelToken::new())?,
        )?;
        ensure!(
            !env.stdout.is_empty(),
            "env printed nothing, so it proves nothing"
        );
        clean("the sandbox's environment (`env`)", &env.stdout, &secrets)?;
        let environ = s.execute(
            id,
            &cmd("cat", &["/proc/self/environ"]),
            None,
            CancelToken::new(),
        )?;
        clean(
            "/proc/self/environ in the sandbox",
            &outcome_text(&environ),
            &secrets,
        )?;

        // Errors: bad input, a request the API rejects, a missing command.
        let bad_requests = [
            cmd("", &[]),
            cmd("echo", &["nul\0byte"]),
            ExecuteRequest {
                cwd: Some(format!("/kit-no-such-dir-{}", unique_marker())),
                ..cmd("true", &[])
            },
            ExecuteRequest {
                env: vec![("BAD NAME".into(), "x".into())],
                ..cmd("true", &[])
            },
        ];
        for request in &bad_requests {
            let outcome = s.execute(id, request, None, CancelToken::new());
            let text = match &outcome {
                Ok(outcome) => format!("{} / {outcome:?}", outcome_text(outcome)),
                Err(error) => format!("{error:#}"),
            };
            clean("an error or result of a bad request", &text, &secrets)?;
        }

        // The lease store: every record, every reason, every lease.
        for record in s.runtime().store().list()? {
            clean("the lease store", &format!("{record:?}"), &secrets)?;
        }
        Ok(Verdict::passed())
    })
}
