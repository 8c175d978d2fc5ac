//! `execute-request.result-chars` for components built before contract
//! 0.5.0, which always keep 4 Mi characters: the host cuts their answer to
//! the characters asked for, so a host sees the same result from every
//! component it loads.

use crate::wasm::bindings::types::{ExecuteResult, PartialOutput, ProviderError};

/// Cuts each stream's text in `answer` to its last `chars` characters;
/// `output-truncated` is set where a cut dropped any.
pub(crate) fn keep_last_chars(answer: &mut Result<ExecuteResult, ProviderError>, chars: u32) {
    let chars = usize::try_from(chars).unwrap_or(usize::MAX);
    match answer {
        Ok(result) => {
            let cut = keep_last(&mut result.stdout, chars) | keep_last(&mut result.stderr, chars);
            result.output_truncated |= cut;
        }
        Err(error) => {
            if let Some(partial) = partial_of(error) {
                let cut =
                    keep_last(&mut partial.stdout, chars) | keep_last(&mut partial.stderr, chars);
                partial.output_truncated |= cut;
            }
        }
    }
}

/// The partial output an error carries, if any.
fn partial_of(error: &mut ProviderError) -> Option<&mut PartialOutput> {
    match error {
        ProviderError::ApiRejected(e) => e.partial.as_mut(),
        ProviderError::TransportFailed(e) => e.partial.as_mut(),
        ProviderError::InvalidResponse(e) => e.partial.as_mut(),
        ProviderError::Cancelled(partial) => partial.as_mut(),
        ProviderError::CleanupFailed(e) => e.partial.as_mut(),
        ProviderError::OutputLost(e) => Some(&mut e.partial),
        ProviderError::InvalidConfig(_)
        | ProviderError::InvalidRequest(_)
        | ProviderError::ForeignLease(_)
        | ProviderError::Unsupported(_) => None,
    }
}

/// Keeps the last `chars` characters of `text`; true when any were dropped.
fn keep_last(text: &mut String, chars: usize) -> bool {
    let total = text.chars().count();
    if total <= chars {
        return false;
    }
    let at = text
        .char_indices()
        .nth(total - chars)
        .map_or(text.len(), |(at, _)| at);
    text.drain(..at);
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wasm::bindings::types::{CleanupCause, CleanupFailure, CleanupPhase};

    fn result(stdout: &str, stderr: &str) -> ExecuteResult {
        ExecuteResult {
            exit_code: Some(0),
            signal: None,
            timed_out: false,
            stdout: stdout.into(),
            stderr: stderr.into(),
            process_id: "p".into(),
            output_truncated: false,
        }
    }

    #[allow(clippy::result_large_err)]
    fn cut(
        mut answer: Result<ExecuteResult, ProviderError>,
        chars: u32,
    ) -> Result<ExecuteResult, ProviderError> {
        keep_last_chars(&mut answer, chars);
        answer
    }

    #[test]
    fn a_result_keeps_the_last_characters_and_says_when_it_cut() {
        let kept = cut(Ok(result("héllo wörld", "€€€")), 4).unwrap();
        assert_eq!(
            (kept.stdout.as_str(), kept.stderr.as_str()),
            ("örld", "€€€")
        );
        assert!(kept.output_truncated);
        let kept = cut(Ok(result("abc", "")), 3).unwrap();
        assert_eq!(kept.stdout, "abc");
        assert!(!kept.output_truncated);
        let kept = cut(Ok(result("abc", "d")), 0).unwrap();
        assert_eq!((kept.stdout.as_str(), kept.stderr.as_str()), ("", ""));
        assert!(kept.output_truncated);
        let kept = cut(Ok(result("", "")), 0).unwrap();
        assert!(!kept.output_truncated);
    }

    #[test]
    fn the_partial_output_of_an_error_is_cut_too() {
        let error = ProviderError::CleanupFailed(CleanupFailure {
            sandbox_id: None,
            process_id: None,
            phase: CleanupPhase::ProcessTermination,
            cause: CleanupCause::Deadline,
            partial: Some(PartialOutput {
                stdout: "0123456789".into(),
                stderr: String::new(),
                timed_out: true,
                output_truncated: false,
            }),
        });
        match cut(Err(error), 2) {
            Err(ProviderError::CleanupFailed(e)) => {
                let partial = e.partial.unwrap();
                assert_eq!(partial.stdout, "89");
                assert!(partial.output_truncated && partial.timed_out);
            }
            other => panic!("{other:?}"),
        }
    }
}
