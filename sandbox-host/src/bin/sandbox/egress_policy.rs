//! The `--egress` values of `lease acquire` and `lease egress` as the
//! lease's egress policy (contract 0.7.0). The provider SDK checks and
//! normalises each entry; here only the two words and the list's shape.

use anyhow::{bail, Result};
use sandbox_host::types::EgressPolicy;

/// `none` alone: block all; `*` (or `any`) alone: unrestricted; else the
/// entries as an allow-list (each value may hold several, separated by
/// commas). No value: no policy of the lease's own.
pub fn parse(values: &[String]) -> Result<Option<EgressPolicy>> {
    let entries: Vec<String> = values
        .iter()
        .flat_map(|value| value.split(','))
        .map(|entry| entry.trim().to_owned())
        .collect();
    if entries.is_empty() {
        return Ok(None);
    }
    if entries.iter().any(String::is_empty) {
        bail!("--egress has an empty entry; give HOST[:PORT], *.DOMAIN[:PORT], IP[:PORT] or ADDRESS/PREFIX, `none` or `*`");
    }
    let word = |w: &str| entries.iter().any(|e| e.eq_ignore_ascii_case(w));
    let everything = entries
        .iter()
        .any(|e| e == "*" || e.eq_ignore_ascii_case("any"));
    match entries.len() {
        1 if word("none") => Ok(Some(EgressPolicy::BlockAll)),
        1 if everything => Ok(Some(EgressPolicy::Unrestricted)),
        _ if word("none") => {
            bail!("--egress none blocks every destination: give it alone, not with other entries")
        }
        _ if everything => {
            bail!("--egress '*' allows every destination: give it alone, not with other entries")
        }
        _ => Ok(Some(EgressPolicy::Allow(entries))),
    }
}

/// The policy in words (for people).
pub fn text(policy: &EgressPolicy) -> String {
    match policy {
        EgressPolicy::BlockAll => "no outbound connection (none)".to_owned(),
        EgressPolicy::Unrestricted => "the service's default, no list of its own (*)".to_owned(),
        EgressPolicy::Allow(entries) => format!("only {}", entries.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(values: &[&str]) -> Result<Option<EgressPolicy>> {
        parse(&values.iter().map(|v| v.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn words_and_lists() {
        assert!(parsed(&[]).unwrap().is_none());
        assert!(matches!(
            parsed(&["none"]).unwrap(),
            Some(EgressPolicy::BlockAll)
        ));
        assert!(matches!(
            parsed(&["*"]).unwrap(),
            Some(EgressPolicy::Unrestricted)
        ));
        match parsed(&["a.test:443, 10.0.0.0/8", "b.test"]).unwrap() {
            Some(EgressPolicy::Allow(entries)) => {
                assert_eq!(entries, ["a.test:443", "10.0.0.0/8", "b.test"])
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_words_stand_alone() {
        for bad in [&["none", "a.test"][..], &["*", "a.test"], &["a.test,"]] {
            let error = parsed(bad).unwrap_err().to_string();
            assert!(error.starts_with("--egress"), "{error}");
        }
    }
}
