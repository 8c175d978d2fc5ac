//! The conformance kit (`src/`) on every provider of the workspace, each
//! against its face of `createos-local` (real processes, real fault
//! injection). Needs `./build.sh`. `cargo test conformance` runs them all.

sandbox_conformance::conformance_suite!(
    conformance_createos,
    sandbox_conformance::workspace_targets::createos()
);
sandbox_conformance::conformance_suite!(
    conformance_daytona,
    sandbox_conformance::workspace_targets::daytona(),
    // The Daytona face cannot be made to drop output a follower has not
    // read (see workspace_targets::daytona_faults).
    not_applicable = ["output_lost"]
);
