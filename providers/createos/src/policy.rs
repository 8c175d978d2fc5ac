//! The environment policy (contract 0.7.0) as the CreateOS API carries it:
//! the egress rules of `POST /v1/sandboxes` and `PUT …/egress`, and what a
//! sandbox starts from (a template, an image, the config's image for the
//! adapter, the config's image). Everything here is decided before any
//! request.

use crate::config::Config;
use provider_sdk::acquire::AcquirePolicy;
use provider_sdk::egress::Egress;
use provider_sdk::types::ProviderError;

/// The rules for a policy: `[]` (which CreateOS reads as allow-all) for
/// `unrestricted`, the normalised entries for an allow-list (CreateOS
/// takes every kind of entry the contract has: host names and
/// `*.domain` with an optional port, IP literals, `[v6]:port`, ranges).
/// `block-all` is `unsupported`: CreateOS has no deny-all rule, and `[]`
/// would allow everything.
pub fn egress_rules(egress: &Egress) -> Result<Vec<String>, ProviderError> {
    match egress {
        Egress::BlockAll => Err(ProviderError::Unsupported(
            "CreateOS has no deny-all egress rule (an empty list allows everything): block-all cannot be enforced; allow one destination instead".into(),
        )),
        Egress::Unrestricted => Ok(Vec::new()),
        Egress::Allow(_) => Ok(egress.to_entries()),
    }
}

/// What a new sandbox starts from and under which policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Start {
    /// `rootfs` to send, if any.
    pub rootfs: Option<String>,
    /// `template` to send (its reference), if any.
    pub template: Option<String>,
    /// Whether the request chose it (not the config).
    pub image_asked: bool,
    /// The policy in force: the request's, else the config's base list.
    pub egress: Option<Egress>,
    /// The rules to send on create: none for the service's default.
    pub egress_rules: Option<Vec<String>>,
}

/// Resolves a request against the config: template, else the request's
/// image, else the config's image for the adapter (`rootfsByAdapter`),
/// else `rootfs`; the request's egress, else `egressAllowlist`.
/// `block-all` is refused here, before any request.
pub fn start(config: &Config, policy: &AcquirePolicy) -> Result<Start, ProviderError> {
    let egress = policy
        .egress
        .clone()
        .or_else(|| config.egress_allowlist.clone());
    let egress_rules = match &egress {
        // Unrestricted is the service's default: no list at all.
        None | Some(Egress::Unrestricted) => None,
        Some(policy) => Some(egress_rules(policy)?),
    };
    let image_asked = policy.template.is_some() || policy.image.is_some();
    let rootfs = match (&policy.template, &policy.image) {
        (Some(_), _) => None,
        (None, Some(image)) => Some(image.clone()),
        (None, None) => config
            .rootfs_for(policy.adapter_type.as_deref())
            .map(str::to_string),
    };
    Ok(Start {
        rootfs,
        template: policy.template.clone(),
        image_asked,
        egress,
        egress_rules,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use provider_sdk::config::ProviderConfig;
    use provider_sdk::egress;
    use wasm_bindgen_test::wasm_bindgen_test;

    fn config(json: &str) -> Config {
        Config::parse(json).unwrap()
    }

    fn policy() -> AcquirePolicy {
        AcquirePolicy {
            egress: None,
            adapter_type: None,
            image: None,
            template: None,
        }
    }

    fn allow(entries: &[&str]) -> Egress {
        let list: Vec<String> = entries.iter().map(|e| e.to_string()).collect();
        egress::normalize_list(&list).unwrap()
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn images_follow_template_then_image_then_adapter_then_rootfs() {
        let config = config(r#"{"rootfs":"base","rootfsByAdapter":{"claude_local":"claude"}}"#);
        let with = |adapter: Option<&str>, image: Option<&str>, template: Option<&str>| {
            let start = start(
                &config,
                &AcquirePolicy {
                    adapter_type: adapter.map(str::to_string),
                    image: image.map(str::to_string),
                    template: template.map(str::to_string),
                    ..policy()
                },
            )
            .unwrap();
            (start.rootfs, start.template, start.image_asked)
        };
        assert_eq!(with(None, None, None), (Some("base".into()), None, false));
        assert_eq!(
            with(Some("codex_local"), None, None),
            (Some("base".into()), None, false)
        );
        assert_eq!(
            with(Some("claude_local"), None, None),
            (Some("claude".into()), None, false)
        );
        assert_eq!(
            with(Some("claude_local"), Some("mine"), None),
            (Some("mine".into()), None, true)
        );
        assert_eq!(
            with(Some("claude_local"), None, Some("t.x")),
            (None, Some("t.x".into()), true)
        );
        let plain = Config::parse("{}").unwrap();
        assert_eq!(start(&plain, &policy()).unwrap().rootfs, None);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn egress_is_the_request_s_else_the_config_s_and_block_all_is_refused() {
        let base = config(r#"{"egressAllowlist":["a.com"]}"#);
        let plain = Config::parse("{}").unwrap();
        let rules = |config: &Config, egress: Option<Egress>| {
            start(config, &AcquirePolicy { egress, ..policy() }).map(|s| (s.egress, s.egress_rules))
        };
        assert_eq!(rules(&plain, None).unwrap(), (None, None));
        assert_eq!(
            rules(&base, None).unwrap(),
            (Some(allow(&["a.com"])), Some(vec!["a.com".to_string()]))
        );
        assert_eq!(
            rules(
                &base,
                Some(allow(&["[::1]:80", "*.b.org:443", "10.0.0.0/8"]))
            )
            .unwrap(),
            (
                Some(allow(&["[::1]:80", "*.b.org:443", "10.0.0.0/8"])),
                Some(vec![
                    "[::1]:80".to_string(),
                    "*.b.org:443".to_string(),
                    "10.0.0.0/8".to_string()
                ])
            )
        );
        assert_eq!(
            rules(&base, Some(Egress::Unrestricted)).unwrap(),
            (Some(Egress::Unrestricted), None)
        );
        for config in [&base, &plain] {
            match rules(config, Some(Egress::BlockAll)) {
                Err(ProviderError::Unsupported(message)) => assert!(message.contains("deny-all")),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(
            egress_rules(&Egress::Unrestricted).unwrap(),
            Vec::<String>::new()
        );
    }
}
