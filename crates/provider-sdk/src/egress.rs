//! Egress policies (`egress-policy`, contract 0.7.0), normalised once for
//! every provider: the allow-list's entries trimmed, duplicates dropped,
//! each parsed into a [`Destination`] that a provider maps to its service
//! (or refuses, never drops). The rules are the WIT's
//! (`wit/since_v0.7.0/types.wit`, `egress-policy`).
//!
//! A policy is kept in a lease's metadata as a list of entries
//! ([`Egress::to_entries`], [`Egress::from_entries`]): `[]` for block-all,
//! `["*"]` for unrestricted, else the normalised entries.
//!
//! An entry keeps its text (trimmed, lowercased): an address is written as
//! given, and a range must be written with its network's address
//! (`10.0.0.0/8`, not `10.1.2.3/8`), so the component formats no address.

use crate::types::{EgressPolicy, ProviderError};
use ipnet::IpNet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// A normalised egress policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Egress {
    /// No outbound connection at all.
    BlockAll,
    /// Only these destinations (at least one, no duplicates).
    Allow(Vec<Destination>),
    /// The service's default, no list of the run's own.
    Unrestricted,
}

/// One destination of an allow-list: what it allows, and its entry as
/// normalised text (trimmed, ASCII lowercase), which is what services take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Destination {
    /// The normalised entry (`*.example.com:443`, `[::1]:8080`,
    /// `10.0.0.0/8`).
    pub entry: String,
    /// What the entry allows.
    pub kind: Kind,
}

/// What kind of destination an entry names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// A host name (`example.com`), or with `subdomains` the names under
    /// it (`*.example.com`); any port when `port` is none.
    Host {
        /// The name, without the `*.` of a wildcard.
        name: String,
        /// `*.name`: the names under `name`.
        subdomains: bool,
        /// The one port allowed, if any.
        port: Option<u16>,
    },
    /// An IP address; any port when `port` is none.
    Address {
        /// The address.
        ip: IpAddr,
        /// The one port allowed, if any.
        port: Option<u16>,
    },
    /// An address range (any port); its address is the network's (no host
    /// bits set).
    Range(IpNet),
}

impl Destination {
    /// The port the entry is limited to, if any.
    pub fn port(&self) -> Option<u16> {
        match &self.kind {
            Kind::Host { port, .. } | Kind::Address { port, .. } => *port,
            Kind::Range(_) => None,
        }
    }
}

impl Egress {
    /// The policy as a list of entries, as a lease's metadata keeps it and
    /// a config writes it: `[]` for block-all (an allow-list is never
    /// empty), `["*"]` for unrestricted.
    pub fn to_entries(&self) -> Vec<String> {
        match self {
            Egress::BlockAll => Vec::new(),
            Egress::Unrestricted => vec!["*".into()],
            Egress::Allow(list) => entries(list),
        }
    }

    /// A policy kept by [`Egress::to_entries`]; none when the list is not
    /// one.
    pub fn from_entries(list: &[String]) -> Option<Egress> {
        if list.is_empty() {
            return Some(Egress::BlockAll);
        }
        normalize_list(list).ok()
    }
}

/// The normalised entries of a list, in order.
pub fn entries(list: &[Destination]) -> Vec<String> {
    list.iter().map(|d| d.entry.clone()).collect()
}

/// Normalises a policy as the contract states it; a malformed one is
/// `invalid-request`.
pub fn normalize(policy: &EgressPolicy) -> Result<Egress, ProviderError> {
    match policy {
        EgressPolicy::BlockAll => Ok(Egress::BlockAll),
        EgressPolicy::Unrestricted => Ok(Egress::Unrestricted),
        EgressPolicy::Allow(list) => normalize_list(list).map_err(ProviderError::InvalidRequest),
    }
}

/// Normalises an allow-list (also a config's): trimmed, duplicates
/// dropped, `*` alone is [`Egress::Unrestricted`]. The error names the
/// first bad entry (by position when it holds a control character).
pub fn normalize_list(list: &[String]) -> Result<Egress, String> {
    if list.is_empty() {
        return Err("the egress allow-list is empty (use block-all to allow nothing)".into());
    }
    let mut out: Vec<Destination> = Vec::with_capacity(list.len());
    let mut star = false;
    for (index, raw) in list.iter().enumerate() {
        let entry = raw.trim();
        let bad = |why: &str| {
            let shown = if entry.chars().any(char::is_control) {
                format!("entry {}", index + 1)
            } else {
                format!("entry {} '{entry}'", index + 1)
            };
            Err(format!("egress {shown} {why}"))
        };
        if entry.is_empty() {
            return bad("is empty");
        }
        if entry.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return bad("has a control character or whitespace inside");
        }
        if entry == "*" {
            star = true;
            continue;
        }
        let Some(destination) = parse(entry) else {
            return bad("is not a host name, *.domain, IP address or address/prefix (each with an optional :port, ranges without)");
        };
        if !out.iter().any(|d| d.entry == destination.entry) {
            out.push(destination);
        }
    }
    match (star, out.is_empty()) {
        (true, true) => Ok(Egress::Unrestricted),
        (true, false) => {
            Err("egress '*' (allow everything) cannot stand beside other entries".into())
        }
        (false, _) => Ok(Egress::Allow(out)),
    }
}

/// One entry, already trimmed and free of whitespace.
fn parse(entry: &str) -> Option<Destination> {
    let entry = entry.to_ascii_lowercase();
    let kind = kind_of(&entry)?;
    Some(Destination { entry, kind })
}

fn kind_of(entry: &str) -> Option<Kind> {
    if let Some((address, prefix)) = entry.split_once('/') {
        // `address/prefix`, the address being the network's own.
        let ip: IpAddr = address.parse().ok()?;
        if prefix.is_empty() || prefix.len() > 3 || !prefix.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let net = IpNet::new(ip, prefix.parse().ok()?).ok()?;
        return (net.network() == ip).then_some(Kind::Range(net));
    }
    if let Ok(ip) = entry.parse::<IpAddr>() {
        return Some(Kind::Address { ip, port: None });
    }
    if let Some(rest) = entry.strip_prefix('[') {
        let (ip, port) = rest.split_once("]:")?;
        let ip: Ipv6Addr = ip.parse().ok()?;
        return Some(Kind::Address {
            ip: IpAddr::V6(ip),
            port: Some(port_number(port)?),
        });
    }
    let (host, port) = match entry.split_once(':') {
        Some((host, port)) => (host, Some(port_number(port)?)),
        None => (entry, None),
    };
    if let Ok(ip) = host.parse::<Ipv4Addr>() {
        return Some(Kind::Address {
            ip: IpAddr::V4(ip),
            port,
        });
    }
    let (name, subdomains) = match host.strip_prefix("*.") {
        Some(name) => (name, true),
        None => (host, false),
    };
    is_host_name(name).then(|| Kind::Host {
        name: name.into(),
        subdomains,
        port,
    })
}

/// A port from 1 to 65535, in decimal digits only.
fn port_number(text: &str) -> Option<u16> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok().filter(|port| *port != 0)
}

/// A DNS name: labels of 1-63 ASCII letters, digits and `-` (not at
/// either end), at most 253 characters, the last label not all digits (so
/// a mistyped address is not taken for a name).
fn is_host_name(name: &str) -> bool {
    let label_ok = |label: &str| {
        (1..=63).contains(&label.len())
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    };
    name.len() <= 253
        && name.split('.').all(label_ok)
        && !name
            .rsplit('.')
            .next()
            .is_some_and(|last| last.bytes().all(|b| b.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    fn list(entries: &[&str]) -> Vec<String> {
        entries.iter().map(|e| e.to_string()).collect()
    }

    fn normalized(entries: &[&str]) -> Vec<String> {
        match normalize_list(&list(entries)) {
            Ok(Egress::Allow(list)) => super::entries(&list),
            other => panic!("{entries:?}: {other:?}"),
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn every_kind_of_entry_is_parsed_and_written_back() {
        assert_eq!(
            normalized(&[
                " Example.COM ",
                "*.example.org:443",
                "10.0.0.1",
                "10.0.0.1:8080",
                "::1",
                "[::1]:8080",
                "10.0.0.0/8",
                "FD00::/8",
                "localhost:9",
            ]),
            [
                "example.com",
                "*.example.org:443",
                "10.0.0.1",
                "10.0.0.1:8080",
                "::1",
                "[::1]:8080",
                "10.0.0.0/8",
                "fd00::/8",
                "localhost:9",
            ]
        );
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn duplicates_are_dropped_after_trimming_and_lowercasing() {
        assert_eq!(
            normalized(&["a.com", " A.com", "a.com ", "10.0.0.0/8", "10.0.0.0/8 "]),
            ["a.com", "10.0.0.0/8"]
        );
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_star_alone_is_unrestricted_and_never_beside_others() {
        assert_eq!(normalize_list(&list(&[" * "])), Ok(Egress::Unrestricted));
        assert_eq!(normalize_list(&list(&["*", "*"])), Ok(Egress::Unrestricted));
        let error = normalize_list(&list(&["*", "a.com"])).unwrap_err();
        assert!(error.contains("beside"), "{error}");
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn bad_lists_are_refused_naming_the_entry() {
        assert!(normalize_list(&[]).unwrap_err().contains("empty"));
        for (entries, says) in [
            (&["a.com", "  "][..], "entry 2 '' is empty"),
            (&["a b.com"][..], "whitespace"),
            (&["a.com\u{7}"][..], "entry 1 has a control"),
            (&["a\tb"][..], "entry 1 has a control"),
            (&["a..com"][..], "is not"),
            (&["-a.com"][..], "is not"),
            (&["a.com:0"][..], "is not"),
            (&["a.com:65536"][..], "is not"),
            (&["a.com:+1"][..], "is not"),
            (&["a.com:"][..], "is not"),
            (&["10.0.0.0/8:443"][..], "is not"),
            (&["10.0.0.0/33"][..], "is not"),
            (&["10.1.2.3/8"][..], "is not"),
            (&["10.0.0.0/"][..], "is not"),
            (&["10.0.0.0/+8"][..], "is not"),
            (&["10.0.0"][..], "is not"),
            (&["a.*.com"][..], "is not"),
            (&["*.*.com"][..], "is not"),
            (&["*."][..], "is not"),
            (&["[::1]"][..], "is not"),
            (&["::1:80:"][..], "is not"),
            (&["http://a.com"][..], "is not"),
            (&["a_b.com"][..], "is not"),
        ] {
            let error = normalize_list(&list(entries)).unwrap_err();
            assert!(error.contains(says), "{entries:?}: {error}");
            assert!(!error.contains('\u{7}') && !error.contains('\t'));
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn the_contract_policy_is_normalised_and_kept_as_json() {
        assert!(matches!(
            normalize(&EgressPolicy::BlockAll),
            Ok(Egress::BlockAll)
        ));
        assert!(matches!(
            normalize(&EgressPolicy::Unrestricted),
            Ok(Egress::Unrestricted)
        ));
        assert!(matches!(
            normalize(&EgressPolicy::Allow(vec![])),
            Err(ProviderError::InvalidRequest(_))
        ));
        for policy in [
            Egress::BlockAll,
            Egress::Unrestricted,
            normalize_list(&list(&["a.com:1", "[::1]:2", "10.0.0.0/8"])).unwrap(),
        ] {
            assert_eq!(Egress::from_entries(&policy.to_entries()), Some(policy));
        }
        assert_eq!(Egress::from_entries(&list(&["*", "a"])), None);
        assert_eq!(Egress::from_entries(&list(&["a b"])), None);
    }
}
