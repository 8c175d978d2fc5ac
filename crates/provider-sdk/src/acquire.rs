//! The environment policy of an acquire request (contract 0.7.0): its
//! egress policy normalised ([`crate::egress`]), its adapter type and image
//! checked, its template reference bound to the context
//! ([`crate::templates`]). The export checks it before the provider's
//! `acquire-lease` runs, so bad input never causes a request; the provider
//! reads the same typed form with [`AcquirePolicy::of`].

use crate::egress::{self, Egress};
use crate::templates;
use crate::types::{AcquireRequest, EnvironmentContext, ProviderError};

/// What an acquire request asks of the sandbox's environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcquirePolicy {
    /// The normalised egress policy; none leaves it to the config.
    pub egress: Option<Egress>,
    /// The agent adapter, checked with [`check_adapter_type`].
    pub adapter_type: Option<String>,
    /// The image asked for (non-empty, no control character or whitespace).
    pub image: Option<String>,
    /// The template to start from: its service name (the reference, of the
    /// context's company and environment).
    pub template: Option<String>,
}

impl AcquirePolicy {
    /// Checks and reads a request's policy; any problem is
    /// `invalid-request`.
    pub fn of(
        ctx: &EnvironmentContext,
        request: &AcquireRequest,
    ) -> Result<AcquirePolicy, ProviderError> {
        let invalid = |message: &str| Err(ProviderError::InvalidRequest(message.into()));
        let egress = request.egress.as_ref().map(egress::normalize).transpose()?;
        if let Some(adapter) = &request.adapter_type {
            check_adapter_type(adapter)?;
        }
        if let Some(image) = &request.image {
            if image.is_empty()
                || image.len() > 512
                || image.chars().any(|c| c.is_control() || c.is_whitespace())
            {
                return invalid(
                    "an image is 1-512 characters with no whitespace or control character",
                );
            }
        }
        if let Some(template) = &request.template {
            if request.image.is_some() {
                return invalid("an acquire request names either a template or an image, not both");
            }
            templates::name_of(ctx, template)?;
        }
        Ok(AcquirePolicy {
            egress,
            adapter_type: request.adapter_type.clone(),
            image: request.image.clone(),
            template: request.template.clone(),
        })
    }

    /// Whether the request asks for anything of contract 0.7.0.
    pub fn is_empty(&self) -> bool {
        self.egress.is_none()
            && self.adapter_type.is_none()
            && self.image.is_none()
            && self.template.is_none()
    }
}

/// An adapter type: 1-64 of ASCII letters, digits, `_` and `-`.
pub fn check_adapter_type(adapter: &str) -> Result<(), ProviderError> {
    let ok = (1..=64).contains(&adapter.len())
        && adapter
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(ProviderError::InvalidRequest(
            "an adapter type is 1-64 of ASCII letters, digits, '_' and '-'".into(),
        ))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::testing::context;
    use crate::types::EgressPolicy;
    use wasm_bindgen_test::wasm_bindgen_test;

    /// A request of contract 0.6.0's fields only.
    pub fn plain_request() -> AcquireRequest {
        crate::testing::acquire_request("run")
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn adapter_types_are_checked() {
        for good in ["claude_local", "a", "A-1", &"x".repeat(64)] {
            assert!(check_adapter_type(good).is_ok(), "{good}");
        }
        for bad in ["", "a b", "a.b", "ü", &"x".repeat(65)] {
            assert!(check_adapter_type(bad).is_err(), "{bad}");
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_request_is_read_or_refused() {
        let ctx = context("{}");
        let policy = AcquirePolicy::of(&ctx, &plain_request()).unwrap();
        assert!(policy.is_empty());
        let reference = templates::reference(&ctx, "base").unwrap();
        let request = AcquireRequest {
            egress: Some(EgressPolicy::Allow(vec![" a.com ".into()])),
            adapter_type: Some("codex_local".into()),
            template: Some(reference.clone()),
            ..plain_request()
        };
        let policy = AcquirePolicy::of(&ctx, &request).unwrap();
        assert_eq!(
            policy.egress,
            Some(egress::normalize_list(&["a.com".into()]).unwrap())
        );
        assert_eq!(policy.template, Some(reference.clone()));
        for bad in [
            AcquireRequest {
                egress: Some(EgressPolicy::Allow(vec!["*".into(), "a.com".into()])),
                ..plain_request()
            },
            AcquireRequest {
                adapter_type: Some("bad adapter".into()),
                ..plain_request()
            },
            AcquireRequest {
                image: Some("".into()),
                ..plain_request()
            },
            AcquireRequest {
                image: Some("ubuntu latest".into()),
                ..plain_request()
            },
            AcquireRequest {
                image: Some("ubuntu".into()),
                template: Some(reference.clone()),
                ..plain_request()
            },
            AcquireRequest {
                template: Some("0000000000000000.base".into()),
                ..plain_request()
            },
        ] {
            assert!(
                matches!(
                    AcquirePolicy::of(&ctx, &bad),
                    Err(ProviderError::InvalidRequest(_))
                ),
                "{bad:?}"
            );
        }
    }
}
