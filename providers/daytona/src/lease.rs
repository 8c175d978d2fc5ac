//! The lease metadata the provider writes at acquire and checks on every
//! later call, and the labels that tie a sandbox to its lease.

use provider_sdk::http::is_valid_id;
use provider_sdk::types::{EnvironmentContext, Lease, ProviderError};
use serde::{Deserialize, Serialize};

/// The workspace directory under the sandbox user's home.
pub const WORKSPACE_DIR: &str = "paperclip-workspace";

/// The provider name in lease metadata.
pub const PROVIDER: &str = "daytona";
/// The label holding the lease's random marker.
pub const MARKER_LABEL: &str = "paperclip.lease";
/// The label holding the environment id.
pub const ENVIRONMENT_LABEL: &str = "paperclip.environment";

/// What a lease's `metadata` holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaseMetadata {
    /// Always `daytona`.
    pub provider: String,
    /// The sandbox.
    pub sandbox_id: String,
    /// The environment that acquired it.
    pub environment_id: String,
    /// The company that acquired it.
    pub company_id: String,
    /// The random marker also set as the sandbox's [`MARKER_LABEL`].
    pub marker: String,
    /// The command's default cwd: the workspace root, or the directory
    /// the acquire asked for.
    pub cwd: String,
    /// The workspace root (`{home}/paperclip-workspace`), against which
    /// relative paths resolve. Absent in leases of earlier versions (see
    /// [`LeaseMetadata::workspace_root`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
    /// The snapshot the sandbox was created from, if one was sent (a
    /// template's reference, the request's image, or the config's for the
    /// lease's adapter). Contract 0.7.0, as the fields below.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    /// The agent adapter the lease was acquired for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adapter_type: Option<String>,
    /// Whether the request chose the snapshot (an image or a template),
    /// so that the config's do not decide it.
    #[serde(default)]
    pub image_asked: bool,
    /// The egress policy in force (`Egress::to_entries`); none for the
    /// service's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<Vec<String>>,
    /// The config's base egress list when the sandbox was created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_egress: Option<Vec<String>>,
}

impl LeaseMetadata {
    /// The metadata as the lease's JSON text.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The workspace root: the recorded one, or (for a lease of an
    /// earlier version) `cwd` up to its workspace directory.
    pub fn workspace_root(&self) -> String {
        if let Some(root) = &self.workspace {
            return root.clone();
        }
        let marker = format!("/{}", WORKSPACE_DIR);
        match self.cwd.find(&marker) {
            Some(at) => self.cwd[..at + marker.len()].to_string(),
            None => self.cwd.clone(),
        }
    }
}

/// Reads and checks a lease's metadata: another provider's, environment's
/// or company's lease is `foreign-lease`, before any request.
pub fn check(lease: &Lease, ctx: &EnvironmentContext) -> Result<LeaseMetadata, ProviderError> {
    let metadata: LeaseMetadata = serde_json::from_str(&lease.metadata).map_err(|_| {
        ProviderError::ForeignLease("the lease metadata is not a Daytona lease's".into())
    })?;
    if metadata.provider != PROVIDER {
        return Err(ProviderError::ForeignLease(
            "the lease belongs to another provider".into(),
        ));
    }
    if metadata.environment_id != ctx.environment_id || metadata.company_id != ctx.company_id {
        return Err(ProviderError::ForeignLease(
            "the lease belongs to another environment or company".into(),
        ));
    }
    if !is_valid_id(&metadata.sandbox_id) || metadata.sandbox_id != lease.provider_lease_id {
        return Err(ProviderError::ForeignLease(
            "the lease has an invalid sandbox id".into(),
        ));
    }
    Ok(metadata)
}

/// The sandbox a lease names for destroy: its metadata's, or, for a lease
/// with empty metadata (`{}`, what a host records after a failed acquire
/// or a recorded sandbox), its `provider-lease-id`.
pub fn sandbox_for_destroy(
    lease: &Lease,
    ctx: &EnvironmentContext,
) -> Result<String, ProviderError> {
    if lease.metadata.trim() == "{}" {
        if is_valid_id(&lease.provider_lease_id) {
            return Ok(lease.provider_lease_id.clone());
        }
        return Err(ProviderError::ForeignLease(
            "the lease has an invalid sandbox id".into(),
        ));
    }
    check(lease, ctx).map(|m| m.sandbox_id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    fn ctx(environment: &str) -> EnvironmentContext {
        EnvironmentContext {
            driver_key: "daytona".into(),
            company_id: "co".into(),
            environment_id: environment.into(),
            issue_id: None,
            config: "{}".into(),
        }
    }

    fn lease() -> Lease {
        let metadata = LeaseMetadata {
            provider: PROVIDER.into(),
            sandbox_id: "sb-1".into(),
            environment_id: "env".into(),
            company_id: "co".into(),
            marker: "m".into(),
            cwd: "/root/paperclip-workspace".into(),
            workspace: Some("/root/paperclip-workspace".into()),
            snapshot: None,
            adapter_type: None,
            image_asked: false,
            egress: None,
            base_egress: None,
        };
        Lease {
            provider_lease_id: "sb-1".into(),
            metadata: metadata.to_json(),
            expires_at: None,
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn another_environments_lease_is_foreign() {
        assert!(check(&lease(), &ctx("env")).is_ok());
        assert!(matches!(
            check(&lease(), &ctx("other")),
            Err(ProviderError::ForeignLease(_))
        ));
        let mut swapped = lease();
        swapped.provider_lease_id = "sb-2".into();
        assert!(check(&swapped, &ctx("env")).is_err());
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn an_earlier_lease_finds_its_workspace_root_in_its_cwd() {
        let mut metadata: LeaseMetadata = serde_json::from_str(&lease().metadata).unwrap();
        metadata.workspace = None;
        metadata.cwd = "/home/daytona/paperclip-workspace/sub/dir".into();
        assert_eq!(
            metadata.workspace_root(),
            "/home/daytona/paperclip-workspace"
        );
        let text = metadata.to_json();
        assert!(!text.contains("workspace\""), "{text}");
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn an_empty_metadata_lease_is_destroyed_by_its_id() {
        let bare = Lease {
            provider_lease_id: "sb-9".into(),
            metadata: "{}".into(),
            expires_at: None,
        };
        assert_eq!(sandbox_for_destroy(&bare, &ctx("env")).unwrap(), "sb-9");
        let hostile = Lease {
            provider_lease_id: "../x".into(),
            ..bare
        };
        assert!(sandbox_for_destroy(&hostile, &ctx("env")).is_err());
    }
}
