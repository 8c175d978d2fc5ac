//! `sandbox describe`: who the provider is, its secrets, API origins and
//! config schema.

use anyhow::Result;

use crate::backend::Setup;
use crate::{ready, report, Global};

pub fn run(global: &Global) -> Result<u8> {
    let setup = ready(Setup::provider_only(global), global)?;
    report::description(setup.runtime.description(), global.json);
    if !global.json {
        let source = crate::backend::find_provider(global.provider.as_deref())?;
        println!("component: {}", source.label());
    }
    #[cfg(feature = "local-backend")]
    if !global.json {
        // What the embedded engine gives on this host (issue 25).
        // The model, tree proof and egress path, as the engine names them.
        if sandbox_engine::machine::offered_here() {
            println!(
                "embedded engine here: one machine per sandbox (what a command leaves \
                 running persists and answers later commands); tree proof: {}; outbound \
                 network off unless --egress allows destinations (a proxy on each \
                 machine's loopback)",
                sandbox_engine::machine::tree_proof_offered_here().describe()
            );
        } else {
            println!(
                "embedded engine here: FALLBACK, namespaces per command ({}): nothing a \
                 command leaves running reaches the next command; no outbound network \
                 (--egress needs one machine per sandbox)",
                sandbox_engine::machine::user_namespaces_refused().unwrap_or_default()
            );
        }
        if sandbox_engine::machine::offered_here() {
            println!(
                "embedded engine ids: {}",
                sandbox_engine::trees::id_map::describe_here()
            );
        }
        println!(
            "embedded engine disk: {}",
            sandbox_engine::storage::disk::describe_here()
        );
        if sandbox_engine::trees::process_limits::memory_limit_offered_here() {
            println!(
                "embedded engine memory: limited per sandbox by what it uses (its cgroup memory \
                 group, default {} MiB), never by the address space it reserves",
                sandbox_engine::trees::process_limits::default_sandbox_memory() >> 20
            );
        } else {
            println!(
                "embedded engine memory: NOT limited here (no cgroup memory controller this \
                 user can use); no address-space limit is put in its place"
            );
        }
    }
    Ok(0)
}
