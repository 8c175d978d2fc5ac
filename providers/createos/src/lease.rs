//! The lease metadata the provider writes at acquire and checks on every
//! later call. It never holds a secret.

use crate::config::Config;
use provider_sdk::http::is_valid_id;
use provider_sdk::types::{EnvironmentContext, Lease, ProviderError};
use serde::{Deserialize, Serialize};

/// The value of `provider` in metadata this provider wrote.
pub const PROVIDER: &str = "createos";
/// Where the workspace lives inside the sandbox.
pub const WORKSPACE_ROOT: &str = "/paperclip-workspace";
/// The marker file that proves on resume that the sandbox is the leased one.
pub const MARKER_PATH: &str = "/paperclip-workspace/.paperclip-lease-marker";

/// What a lease's `metadata` JSON holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LeaseMetadata {
    /// Always [`PROVIDER`].
    pub provider: String,
    /// The sandbox id (also the lease's `provider-lease-id`).
    pub sandbox_id: String,
    /// The environment the lease belongs to.
    pub environment_id: String,
    /// The API origin the sandbox lives at.
    pub api_origin: String,
    /// The shape the sandbox was created with.
    pub shape: String,
    /// The root filesystem it was created with, if one was sent (the
    /// request's image, or the config's for the lease's adapter).
    pub rootfs: Option<String>,
    /// The region it was created in, if set.
    pub region: Option<String>,
    /// The workspace directory.
    pub workspace_root: String,
    /// The remote working directory.
    pub cwd: String,
    /// The marker written into the workspace.
    pub marker: String,
    /// Whether release pauses the sandbox for reuse.
    pub reusable: bool,
    /// The agent adapter the lease was acquired for (contract 0.7.0).
    #[serde(default)]
    pub adapter_type: Option<String>,
    /// Whether the request chose what the sandbox started from (an image
    /// or a template), so that the config's images do not decide it.
    #[serde(default)]
    pub image_asked: bool,
    /// The template (its reference) the sandbox started from.
    #[serde(default)]
    pub template: Option<String>,
    /// The egress policy in force (`Egress::to_entries`); none for the
    /// service's default.
    #[serde(default)]
    pub egress: Option<Vec<String>>,
    /// The config's base egress list (`egressAllowlist`) when the sandbox
    /// was created.
    #[serde(default)]
    pub base_egress: Option<Vec<String>>,
    /// The idle window the sandbox was created with.
    #[serde(default)]
    pub auto_pause_after_seconds: Option<u64>,
    /// Whether the sandbox was created with `ingress_enabled`.
    #[serde(default)]
    pub ingress: bool,
}

impl LeaseMetadata {
    /// The lease record for this metadata.
    pub fn to_lease(&self) -> Lease {
        Lease {
            provider_lease_id: self.sandbox_id.clone(),
            // Serialising a struct of strings and bools cannot fail.
            metadata: serde_json::to_string(self).unwrap_or_default(),
            expires_at: None,
        }
    }
}

/// Reads a lease's metadata and checks it belongs to this provider, this
/// environment and this API origin.
pub fn check(
    lease: &Lease,
    ctx: &EnvironmentContext,
    config: &Config,
) -> Result<LeaseMetadata, ProviderError> {
    let foreign = |why: &str| ProviderError::ForeignLease(why.to_string());
    let metadata: LeaseMetadata = serde_json::from_str(&lease.metadata)
        .map_err(|_| foreign("the lease metadata was not written by the CreateOS provider"))?;
    if metadata.provider != PROVIDER {
        return Err(foreign("the lease belongs to another provider"));
    }
    if metadata.environment_id != ctx.environment_id {
        return Err(foreign("the lease belongs to another environment"));
    }
    if metadata.api_origin != config.api_origin {
        return Err(foreign("the lease belongs to another CreateOS API origin"));
    }
    if metadata.sandbox_id != lease.provider_lease_id || !is_valid_id(&metadata.sandbox_id) {
        return Err(foreign("the lease id does not match its metadata"));
    }
    Ok(metadata)
}
