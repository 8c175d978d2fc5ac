//! The HTTP policy of a config: which origins the component may reach and
//! which secret each of them receives (the secret-to-origin routing).

use std::collections::HashMap;

use anyhow::{bail, Context, Result};

use crate::network::policy::{Origin, Policy};
use crate::network::secrets::{check_secret_origin, Secrets, SplitConfig};
use crate::wasm::bindings::types::ProviderDescription;

/// The HTTP policy of a config (no rate limit yet): exactly the origins its
/// fields name (the component must ask for those and no other), each with
/// the secrets its field lists, in the header and scheme `description`
/// declares, by the operator's rules (see [`Secrets`]). A pure decision:
/// the shared secret-routing table (`node/test/scenarios/secret-routing.json`)
/// holds it and the Node host's `splitConfig` / `checkAskedOrigins`.
pub(crate) fn route_policy(
    description: &ProviderDescription,
    split: &SplitConfig,
    secrets: &Secrets,
    asked: &[String],
) -> Result<Policy> {
    let Some(first) = split.origins.first() else {
        bail!(
            "the provider declares no API origin field, so the host cannot allow it any \
             request; it does not follow the sandbox-provider contract (0.2.0 or later)"
        );
    };
    if asked.len() != split.origins.len() {
        bail!(
            "the provider asks for {} API origins ({}), but declares {} origin fields ({}); \
             the host sends requests only to the origins the config names",
            asked.len(),
            asked.join(", "),
            split.origins.len(),
            split
                .origins
                .iter()
                .map(|o| o.field.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    for (text, named) in asked.iter().zip(&split.origins) {
        let origin = Origin::parse(text)
            .with_context(|| format!("the provider's API origin {text:?} is not a valid origin"))?;
        if origin != named.origin {
            bail!(
                "the provider asks to send its requests to {origin}, but the config names \
                 {} (field {}); the host sends requests (and API keys) only to the origins \
                 the config names",
                named.origin,
                named.field
            );
        }
    }
    let mut policy = Policy::new(first.origin.clone());
    for origin in &split.origins[1..] {
        policy = policy.also_allow(origin.origin.clone());
    }
    // Per origin field and header (lower-case), the secret field it carries:
    // two secrets in one header of one origin are refused, naming both.
    let mut carried: HashMap<(&str, String), &str> = HashMap::new();
    for (field, secret) in &split.resolved {
        let Some(declared) = description
            .secrets
            .iter()
            .find(|s| &s.config_field == field)
        else {
            // The provider takes no such secret: it goes nowhere.
            continue;
        };
        let value = match &declared.scheme {
            Some(scheme) => format!("{scheme} {secret}"),
            None => secret.clone(),
        };
        for receiver in split
            .origins
            .iter()
            .filter(|o| o.secret_fields.contains(field))
        {
            if !receiver.named_by_config && !secrets.trusts(&receiver.origin) {
                bail!(
                    "config field {field} holds a secret, but the config does not name the API \
                     URL in field {} and the host does not trust the provider's default {} with \
                     it; set {} in the config",
                    receiver.field,
                    receiver.origin,
                    receiver.field
                );
            }
            check_secret_origin(&receiver.origin)?;
            let header = declared.header.to_ascii_lowercase();
            if let Some(earlier) = carried.insert((&receiver.field, header), field) {
                bail!(
                    "{}: secret fields {earlier} and {field} would both be sent in header {} to \
                     {}; the provider must declare one header per secret for an origin, so \
                     neither was sent",
                    receiver.field,
                    declared.header,
                    receiver.origin
                );
            }
            policy = policy.with_origin_secret(&receiver.origin, &declared.header, &value)?;
        }
    }
    Ok(policy)
}
