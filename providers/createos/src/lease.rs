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
    /// The root filesystem it was created with, if set.
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
