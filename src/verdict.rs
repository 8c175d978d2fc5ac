//! What a scenario concludes: passed (with what it could not check, said
//! plainly), or not applicable to this target (and why). A failure is an
//! error naming what was expected and what happened.

use std::fmt;

/// The outcome of a scenario that did not fail.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Every check held. The notes name checks the target could not make
    /// (for example survivors on a backend whose processes are not on this
    /// machine); empty when everything was checked.
    Passed(Vec<String>),
    /// The target cannot produce what the scenario needs (a fault point,
    /// a capability it does not declare); the reason says which.
    NotApplicable(String),
}

impl Verdict {
    /// Passed with every check made.
    pub fn passed() -> Verdict {
        Verdict::Passed(Vec::new())
    }

    /// Whether the scenario passed.
    pub fn is_passed(&self) -> bool {
        matches!(self, Verdict::Passed(_))
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Passed(notes) if notes.is_empty() => f.write_str("passed"),
            Verdict::Passed(notes) => write!(f, "passed (not checked: {})", notes.join("; ")),
            Verdict::NotApplicable(reason) => write!(f, "not applicable: {reason}"),
        }
    }
}
