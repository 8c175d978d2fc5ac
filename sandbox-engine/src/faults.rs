//! Fault injection and request recording, for tests of CreateOS clients.
//!
//! A [`FaultRule`] matches requests by method and path pattern and applies a
//! [`FaultAction`] a limited or unlimited number of [`Times`]. Patterns match
//! the request path (no query) segment by segment; `*` matches exactly one
//! non-empty segment and `**` (only as the last segment) any rest, e.g.
//! `DELETE /v1/sandboxes/*/processes/*`. Rules are tried in the order they
//! were added; the first matching rule with uses left wins.
//!
//! The same rules can be managed over HTTP (key-protected, outside `/v1`):
//! - `POST /_admin/faults` with a [`FaultRule`] as JSON, e.g.
//!   `{"method":"GET","path":"/v1/sandboxes/*","action":{"kind":"status","status":503},"times":2}`
//!   (`times` is a number or `"always"`; default 1),
//! - `DELETE /_admin/faults` clears all rules,
//! - `GET /_admin/requests` lists recorded requests,
//! - `DELETE /_admin/requests` clears the record,
//! - `GET /_admin/info` shows the isolation mode.

use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};

/// What a matching request gets instead of (or on top of) its normal answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum FaultAction {
    /// Answer `status` at once without running the handler. 4xx bodies are a
    /// `fail` envelope, 5xx an `error` envelope, both marked
    /// `"injected": true` / code `"injected"`; other statuses get an empty
    /// body.
    Status {
        /// HTTP status to answer.
        status: u16,
    },
    /// Sleep `ms` milliseconds, then handle the request normally.
    Delay {
        /// Milliseconds to wait before handling.
        ms: u64,
    },
    /// `/connect` and Daytona command logs with `follow=true`: send
    /// `frames` real frames (log chunks), then abort the connection
    /// without finishing the chunked body (the client sees a truncated,
    /// errored body).
    ResetAfterFrames {
        /// Frames sent before the abort.
        frames: u64,
    },
    /// Streams only (`/connect`, Daytona command logs with `follow=true`):
    /// send `frames` real frames (log chunks), then nothing more while
    /// keeping the connection open: the body neither ends nor fails (a hung
    /// stream).
    StallAfterFrames {
        /// Frames sent before the stall.
        frames: u64,
    },
    /// `/connect` only: send `frames` real frames, then one line that is not
    /// a valid frame, then end the body.
    MalformedFrame {
        /// Frames sent before the bad line.
        frames: u64,
    },
    /// Process `DELETE` only: terminate as usual but report
    /// `tree_exited: false`.
    TreeNotExited,
    /// Handle the request normally (its effects happen, e.g. a process is
    /// created), then abort the connection instead of delivering the answer:
    /// the client sees a transport error and cannot know the outcome.
    DropResponse,
    /// Answer `status` with exactly `body` (as `application/json`) without
    /// running the handler — for invalid envelopes, bad ids, missing fields.
    Respond {
        /// HTTP status.
        status: u16,
        /// Raw body text.
        body: String,
    },
}

/// How many times a rule applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Times {
    /// `n` more times.
    Count(u32),
    /// Every matching request, until the rules are cleared.
    Always(AlwaysTag),
}

/// The literal `"always"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AlwaysTag {
    /// Always.
    Always,
}

impl Times {
    /// Apply once.
    pub const ONCE: Times = Times::Count(1);
    /// Apply always.
    pub const ALWAYS: Times = Times::Always(AlwaysTag::Always);
}

impl Default for Times {
    fn default() -> Self {
        Times::ONCE
    }
}

/// One fault rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultRule {
    /// HTTP method to match (`GET`, …); `None` or `"*"` matches any.
    #[serde(default)]
    pub method: Option<String>,
    /// Path pattern, see the module docs.
    pub path: String,
    /// What to do.
    pub action: FaultAction,
    /// How often.
    #[serde(default)]
    pub times: Times,
}

impl FaultRule {
    /// A rule for `method` and `path`, applied once.
    pub fn new(method: &str, path: &str, action: FaultAction) -> Self {
        Self {
            method: Some(method.to_string()),
            path: path.to_string(),
            action,
            times: Times::ONCE,
        }
    }

    /// Builder-style: apply `n` times.
    pub fn times(mut self, n: u32) -> Self {
        self.times = Times::Count(n);
        self
    }

    /// Builder-style: apply to every matching request.
    pub fn always(mut self) -> Self {
        self.times = Times::ALWAYS;
        self
    }

    fn matches(&self, method: &str, path: &str) -> bool {
        let method_ok = match self.method.as_deref() {
            None | Some("*") => true,
            Some(m) => m.eq_ignore_ascii_case(method),
        };
        method_ok && path_matches(&self.path, path)
    }
}

/// Segment-wise glob match (`*` = one segment, trailing `**` = the rest).
pub fn path_matches(pattern: &str, path: &str) -> bool {
    let pat: Vec<&str> = pattern.trim_end_matches('/').split('/').collect();
    let segs: Vec<&str> = path.trim_end_matches('/').split('/').collect();
    for (i, p) in pat.iter().enumerate() {
        if *p == "**" && i == pat.len() - 1 {
            return segs.len() >= i;
        }
        match segs.get(i) {
            Some(s) if *p == "*" && !s.is_empty() => {}
            Some(s) if p == s => {}
            _ => return false,
        }
    }
    pat.len() == segs.len()
}

/// One request as the server saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RecordedRequest {
    /// HTTP method.
    pub method: String,
    /// Path without query.
    pub path: String,
    /// Status of the answer (0 if the answer was a stream that failed
    /// before its head was sent, which does not happen with axum).
    pub status: u16,
    /// The action of the fault rule applied, if any.
    pub fault: Option<FaultAction>,
}

/// The request record keeps the newest this many requests.
pub const MAX_RECORDED: usize = 10_000;

#[derive(Debug, Default)]
struct State {
    rules: Vec<FaultRule>,
    requests: Vec<RecordedRequest>,
}

/// Shared handle to the fault rules and the request record. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    inner: Arc<Mutex<State>>,
}

impl Faults {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave the state invalid.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds a rule (after the existing ones).
    pub fn add(&self, rule: FaultRule) {
        self.lock().rules.push(rule);
    }

    /// Removes every rule.
    pub fn clear(&self) {
        self.lock().rules.clear();
    }

    /// The rules with uses left.
    pub fn rules(&self) -> Vec<FaultRule> {
        self.lock().rules.clone()
    }

    /// Every request recorded so far, oldest first.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.lock().requests.clone()
    }

    /// How many recorded requests match `method` and the path `pattern`.
    pub fn count(&self, method: &str, pattern: &str) -> usize {
        self.lock()
            .requests
            .iter()
            .filter(|r| r.method.eq_ignore_ascii_case(method) && path_matches(pattern, &r.path))
            .count()
    }

    /// Forgets the recorded requests.
    pub fn clear_requests(&self) {
        self.lock().requests.clear();
    }

    /// Finds the first applicable rule and uses it up once.
    pub(crate) fn take(&self, method: &str, path: &str) -> Option<FaultAction> {
        let mut state = self.lock();
        let idx = state.rules.iter().position(|r| r.matches(method, path))?;
        let rule = &mut state.rules[idx];
        let action = rule.action.clone();
        match &mut rule.times {
            Times::Always(_) => {}
            Times::Count(n) => {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    state.rules.remove(idx);
                }
            }
        }
        Some(action)
    }

    pub(crate) fn record(&self, req: RecordedRequest) {
        let mut state = self.lock();
        if state.requests.len() >= MAX_RECORDED {
            state.requests.remove(0);
        }
        state.requests.push(req);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns() {
        assert!(path_matches(
            "/v1/sandboxes/*/processes/*",
            "/v1/sandboxes/sb-1/processes/p-2"
        ));
        assert!(!path_matches(
            "/v1/sandboxes/*/processes/*",
            "/v1/sandboxes/sb-1/processes/p-2/connect"
        ));
        assert!(path_matches("/v1/**", "/v1/sandboxes/x"));
        assert!(!path_matches("/v1/sandboxes/*", "/v1/sandboxes/"));
    }

    #[test]
    fn counted_rules_run_out() {
        let f = Faults::default();
        f.add(FaultRule::new("GET", "/v1/x", FaultAction::Status { status: 503 }).times(2));
        assert!(f.take("GET", "/v1/x").is_some());
        assert!(f.take("POST", "/v1/x").is_none());
        assert!(f.take("GET", "/v1/x").is_some());
        assert!(f.take("GET", "/v1/x").is_none());
    }

    #[test]
    fn rule_json_shapes() {
        let r: FaultRule = serde_json::from_str(
            r#"{"method":"DELETE","path":"/v1/**","action":{"kind":"tree_not_exited"},"times":"always"}"#,
        )
        .expect("parse");
        assert_eq!(r.times, Times::ALWAYS);
        assert_eq!(r.action, FaultAction::TreeNotExited);
        let r: FaultRule =
            serde_json::from_str(r#"{"path":"/v1/x","action":{"kind":"delay","ms":5}}"#)
                .expect("parse");
        assert_eq!(r.times, Times::ONCE);
    }
}
