//! Template names and references (contract 0.7.0, capability
//! `templates`): a reference is the service's name of the template,
//! `{scope}.{name}`, where the scope is 16 hex digits derived from the
//! company and environment it was captured in. A reference of another
//! company or environment is refused before any request, and listing
//! keeps only the references of the context's scope.
//!
//! The scope is a namespace, not a secret: it keeps one environment's
//! templates apart from another's on one account (the host names the
//! company and environment; a run cannot choose them).

use crate::types::{EnvironmentContext, ProviderError};

/// The longest template name (the service's names hold 64 characters, the
/// scope and its dot take 17 of them).
pub const MAX_NAME: usize = 47;

/// A template name: 1-[`MAX_NAME`] ASCII letters, digits, `.`, `_`, `-`.
pub fn check_name(name: &str) -> Result<(), ProviderError> {
    let ok = (1..=MAX_NAME).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(ProviderError::InvalidRequest(format!(
            "a template name is 1-{MAX_NAME} of ASCII letters, digits, '.', '_' and '-'"
        )))
    }
}

/// The scope of a context's templates: FNV-1a (64 bits) of its company and
/// environment ids, in lowercase hex.
pub fn scope(ctx: &EnvironmentContext) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let bytes = ctx
        .company_id
        .bytes()
        .chain([0])
        .chain(ctx.environment_id.bytes());
    for byte in bytes {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{hash:016x}")
}

/// The reference of template `name` (checked with [`check_name`]) in the
/// context's scope.
pub fn reference(ctx: &EnvironmentContext, name: &str) -> Result<String, ProviderError> {
    check_name(name)?;
    Ok(format!("{}.{name}", scope(ctx)))
}

/// The name inside a reference of the context's scope; a reference of
/// another scope, or not a reference at all, is `invalid-request`.
pub fn name_of<'r>(
    ctx: &EnvironmentContext,
    template_ref: &'r str,
) -> Result<&'r str, ProviderError> {
    let Some((prefix, name)) = template_ref.split_once('.') else {
        return Err(ProviderError::InvalidRequest(
            "the template reference is not one this provider made (scope.name)".into(),
        ));
    };
    check_name(name)?;
    if prefix != scope(ctx) {
        return Err(ProviderError::InvalidRequest(
            "the template reference belongs to another company or environment".into(),
        ));
    }
    Ok(name)
}

/// The name of a service template if it is in the context's scope.
pub fn listed_name<'r>(ctx: &EnvironmentContext, service_name: &'r str) -> Option<&'r str> {
    name_of(ctx, service_name).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::context;
    use wasm_bindgen_test::wasm_bindgen_test;

    fn ctx(company: &str, environment: &str) -> EnvironmentContext {
        EnvironmentContext {
            company_id: company.into(),
            environment_id: environment.into(),
            ..context("{}")
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn names_are_checked() {
        for good in ["a", "setup-1.2_x", &"x".repeat(MAX_NAME)] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        for bad in ["", "a b", "a/b", "é", "a\n", &"x".repeat(MAX_NAME + 1)] {
            assert!(
                matches!(check_name(bad), Err(ProviderError::InvalidRequest(_))),
                "{bad:?}"
            );
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_reference_is_bound_to_its_company_and_environment() {
        let here = ctx("c1", "e1");
        let reference = reference(&here, "base").unwrap();
        assert!(reference.len() <= 64);
        assert_eq!(reference.len(), 16 + 1 + 4);
        assert_eq!(name_of(&here, &reference).unwrap(), "base");
        for other in [ctx("c2", "e1"), ctx("c1", "e2"), ctx("c1e", "1")] {
            match name_of(&other, &reference) {
                Err(ProviderError::InvalidRequest(message)) => {
                    assert!(message.contains("another company"), "{message}")
                }
                result => panic!("{result:?}"),
            }
        }
        let long = super::reference(&here, &"x".repeat(MAX_NAME)).unwrap();
        assert_eq!(long.len(), 64);
        for bad in ["base", "", ".base", "0123456789abcdef.", "x.y/z"] {
            assert!(
                matches!(name_of(&here, bad), Err(ProviderError::InvalidRequest(_))),
                "{bad}"
            );
        }
        assert_eq!(listed_name(&here, &reference), Some("base"));
        assert_eq!(listed_name(&ctx("c2", "e1"), &reference), None);
    }
}
