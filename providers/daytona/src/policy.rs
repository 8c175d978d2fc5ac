//! The environment policy (contract 0.7.0) as Daytona carries it: an
//! egress policy as the network settings of `POST /sandbox` and
//! `POST /sandbox/{id}/network-settings` (`networkBlockAll`,
//! `networkAllowList` of address ranges, `domainAllowList` of domains), and
//! the snapshot a sandbox starts from. Decided before any request.

use crate::config::Config;
use provider_sdk::acquire::AcquirePolicy;
use provider_sdk::egress::{Egress, Kind};
use provider_sdk::types::ProviderError;
use serde_json::{Map, Value};
use std::net::IpAddr;

/// A policy as Daytona's three network fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Network {
    /// `networkBlockAll`.
    pub block_all: bool,
    /// `networkAllowList`: address ranges (an address is its `/32` or
    /// `/128`).
    pub ranges: Vec<String>,
    /// `domainAllowList`: `example.com`, `*.example.com`.
    pub domains: Vec<String>,
}

impl Network {
    /// Maps a policy; an entry with a port is `unsupported` (Daytona's
    /// lists take addresses and domains, any port), never dropped.
    pub fn of(egress: &Egress) -> Result<Network, ProviderError> {
        let mut network = Network {
            block_all: matches!(egress, Egress::BlockAll),
            ranges: Vec::new(),
            domains: Vec::new(),
        };
        let Egress::Allow(list) = egress else {
            return Ok(network);
        };
        for destination in list {
            if destination.port().is_some() {
                return Err(ProviderError::Unsupported(format!(
                    "Daytona's network allow-lists take addresses and domains for every port: egress entry '{}' names a port",
                    destination.entry
                )));
            }
            // Without a port, an entry is a domain, an address or a range
            // as Daytona writes them.
            let entry = &destination.entry;
            match &destination.kind {
                Kind::Host { .. } => network.domains.push(entry.clone()),
                Kind::Address {
                    ip: IpAddr::V4(_), ..
                } => network.ranges.push(format!("{entry}/32")),
                Kind::Address {
                    ip: IpAddr::V6(_), ..
                } => network.ranges.push(format!("{entry}/128")),
                Kind::Range(_) => network.ranges.push(entry.clone()),
            }
        }
        Ok(network)
    }

    /// The fields of a create: only those that narrow the default.
    pub fn create_fields(&self, body: &mut Map<String, Value>) {
        if self.block_all {
            body.insert("networkBlockAll".into(), Value::Bool(true));
        }
        if !self.ranges.is_empty() {
            body.insert(
                "networkAllowList".into(),
                Value::String(self.ranges.join(",")),
            );
        }
        if !self.domains.is_empty() {
            body.insert(
                "domainAllowList".into(),
                Value::String(self.domains.join(",")),
            );
        }
    }

    /// The body of a `network-settings` change: all three fields, so that
    /// nothing of an earlier policy stays.
    pub fn settings(&self) -> Value {
        serde_json::json!({
            "networkBlockAll": self.block_all,
            "networkAllowList": self.ranges.join(","),
            "domainAllowList": self.domains.join(","),
        })
    }
}

/// What a new sandbox starts from and under which policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Start {
    /// `snapshot` to send: the template's reference, else the request's
    /// image, else the config's for the adapter, else `snapshot`.
    pub snapshot: Option<String>,
    /// Whether the request chose it.
    pub image_asked: bool,
    /// The policy in force: the request's, else the config's base list.
    pub egress: Option<Egress>,
    /// Its network fields.
    pub network: Option<Network>,
}

/// Resolves a request against the config (see [`Start`]); an egress
/// entry Daytona cannot enforce is refused here.
pub fn start(config: &Config, policy: &AcquirePolicy) -> Result<Start, ProviderError> {
    let egress = policy
        .egress
        .clone()
        .or_else(|| config.egress_allowlist.clone());
    let network = egress.as_ref().map(Network::of).transpose()?;
    let image_asked = policy.template.is_some() || policy.image.is_some();
    let snapshot = match (&policy.template, &policy.image) {
        (Some(template), _) => Some(template.clone()),
        (None, Some(image)) => Some(image.clone()),
        (None, None) => config
            .snapshot_for(policy.adapter_type.as_deref())
            .map(str::to_string),
    };
    Ok(Start {
        snapshot,
        image_asked,
        egress,
        network,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use provider_sdk::config::ProviderConfig;
    use provider_sdk::egress::normalize_list;
    use wasm_bindgen_test::wasm_bindgen_test;

    fn allow(entries: &[&str]) -> Egress {
        let list: Vec<String> = entries.iter().map(|e| e.to_string()).collect();
        normalize_list(&list).unwrap()
    }

    fn policy() -> AcquirePolicy {
        AcquirePolicy {
            egress: None,
            adapter_type: None,
            image: None,
            template: None,
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn entries_map_to_ranges_and_domains() {
        let network = Network::of(&allow(&[
            "a.com",
            "*.b.org",
            "10.0.0.1",
            "::1",
            "10.0.0.0/8",
        ]))
        .unwrap();
        assert_eq!(
            network,
            Network {
                block_all: false,
                ranges: vec!["10.0.0.1/32".into(), "::1/128".into(), "10.0.0.0/8".into()],
                domains: vec!["a.com".into(), "*.b.org".into()],
            }
        );
        assert_eq!(
            network.settings(),
            serde_json::json!({"networkBlockAll": false, "networkAllowList": "10.0.0.1/32,::1/128,10.0.0.0/8", "domainAllowList": "a.com,*.b.org"})
        );
        let mut body = Map::new();
        Network::of(&allow(&["a.com"]))
            .unwrap()
            .create_fields(&mut body);
        assert_eq!(
            Value::Object(body),
            serde_json::json!({"domainAllowList": "a.com"})
        );
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn block_all_and_unrestricted_are_carried() {
        let mut body = Map::new();
        Network::of(&Egress::BlockAll)
            .unwrap()
            .create_fields(&mut body);
        assert_eq!(
            Value::Object(body),
            serde_json::json!({"networkBlockAll": true})
        );
        let open = Network::of(&Egress::Unrestricted).unwrap();
        let mut body = Map::new();
        open.create_fields(&mut body);
        assert!(body.is_empty());
        assert_eq!(
            open.settings(),
            serde_json::json!({"networkBlockAll": false, "networkAllowList": "", "domainAllowList": ""})
        );
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_port_is_refused_never_dropped() {
        for entry in ["a.com:443", "*.a.com:1", "10.0.0.1:80", "[::1]:8080"] {
            match Network::of(&allow(&["b.com", entry])) {
                Err(ProviderError::Unsupported(message)) => {
                    assert!(message.contains(entry), "{message}")
                }
                other => panic!("{entry}: {other:?}"),
            }
        }
        // The config's base list is refused earlier, by validate-config.
        let refused = Config::parse(r#"{"egressAllowlist":["a.com:443"]}"#).unwrap_err();
        assert!(refused.join(" ").contains("names a port"), "{refused:?}");
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn snapshots_follow_template_then_image_then_adapter_then_config() {
        let config = Config::parse(
            r#"{"snapshot":"base","snapshotByAdapter":{"claude_local":"claude"},"egressAllowlist":["a.com"]}"#,
        )
        .unwrap();
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
            (start.snapshot, start.image_asked)
        };
        assert_eq!(with(None, None, None), (Some("base".into()), false));
        assert_eq!(
            with(Some("claude_local"), None, None),
            (Some("claude".into()), false)
        );
        assert_eq!(
            with(Some("claude_local"), Some("img"), None),
            (Some("img".into()), true)
        );
        assert_eq!(with(None, None, Some("t.x")), (Some("t.x".into()), true));
        let base = start(&config, &policy()).unwrap();
        assert_eq!(base.egress, Some(allow(&["a.com"])));
        let own = start(
            &config,
            &AcquirePolicy {
                egress: Some(Egress::BlockAll),
                ..policy()
            },
        )
        .unwrap();
        assert!(own.network.unwrap().block_all);
    }
}
