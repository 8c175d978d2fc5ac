//! A lease's life through the host: acquire, release, resume, destroy, and
//! the store refusing commands on a lease that is released or destroyed.

use anyhow::{bail, ensure, Context, Result};
use sandbox_host::types::{Capabilities, ResumeOutcome, TerminationAction, WorkspaceRequest};
use sandbox_host::{error_text, LeaseRefused, LeaseState};

use crate::command::{bash, cmd};
use crate::procs::unique_marker;
use crate::scenarios::{expect_refused, succeeded, with_session};
use crate::session::Session;
use crate::target::Target;
use crate::verdict::Verdict;

fn action_text(action: TerminationAction) -> &'static str {
    sandbox_host::action_name(action)
}

/// Destroys `lease_id` through the runtime; the receipt's action.
fn destroy(session: &Session, lease_id: &str) -> Result<TerminationAction> {
    match session.runtime().destroy(session.env(), lease_id)? {
        Ok(receipt) => {
            let state = session.state(lease_id)?;
            ensure!(
                state == LeaseState::Destroyed,
                "a confirmed destroy must record the lease destroyed, it is {state}"
            );
            Ok(receipt.action)
        }
        Err(error) => bail!("destroy failed: {}", error_text(&error)),
    }
}

/// Acquire → command → release → destroy; a second destroy is refused by
/// the store, and the provider itself answers `already-gone` for a sandbox
/// that is gone; a released or destroyed lease refuses commands.
pub fn release_and_destroy(target: &Target) -> Result<Verdict> {
    with_session(target, None, |s| {
        let lease = s.acquire()?;
        let id = &lease.id;
        let provider_lease = lease
            .lease
            .clone()
            .context("an active lease has a sandbox")?;
        let out = succeeded(
            "echo on a new lease",
            s.execute(id, &cmd("echo", &["alive"]), None, Default::default())?,
        )?;
        ensure!(out.stdout == "alive\n", "echo alive: {:?}", out.stdout);

        let receipt = match s.runtime().release(s.env(), id)? {
            Ok(receipt) => receipt,
            Err(error) => bail!("release failed: {}", error_text(&error)),
        };
        ensure!(
            receipt.sandbox_id == provider_lease.provider_lease_id,
            "the release receipt names sandbox {}, the lease is {}",
            receipt.sandbox_id,
            provider_lease.provider_lease_id
        );
        ensure!(
            matches!(
                receipt.action,
                TerminationAction::Deleted | TerminationAction::Paused
            ),
            "release of a live sandbox must delete or pause it, it said {}",
            action_text(receipt.action)
        );
        let state = s.state(id)?;
        ensure!(
            state == LeaseState::Released,
            "after release the lease is {state}"
        );
        expect_refused(s, id, "a released lease")?;

        let action = destroy(s, id)?;
        let expected = match receipt.action {
            TerminationAction::Deleted => TerminationAction::AlreadyGone,
            _ => TerminationAction::Deleted,
        };
        ensure!(
            action == expected,
            "destroy after a release that said {}: expected {}, got {}",
            action_text(receipt.action),
            action_text(expected),
            action_text(action)
        );
        expect_refused(s, id, "a destroyed lease")?;
        match s.runtime().destroy(s.env(), id) {
            Err(error) if error.downcast_ref::<LeaseRefused>().is_some() => {}
            Err(error) => bail!("a second destroy failed, but not as a refusal: {error:#}"),
            Ok(_) => bail!("the store let a destroyed lease be destroyed again"),
        }
        // The provider itself: destroying a sandbox that is gone is success.
        let again = s
            .instance()?
            .destroy_lease(s.env().context(), &provider_lease)?;
        match again {
            Ok(receipt) if receipt.action == TerminationAction::AlreadyGone => {}
            Ok(receipt) => bail!(
                "destroy-lease of a destroyed sandbox said {}, expected already-gone",
                action_text(receipt.action)
            ),
            Err(error) => bail!(
                "destroy-lease of a destroyed sandbox failed: {}",
                error_text(&error)
            ),
        }

        // A lease destroyed without a release.
        let second = s.acquire()?;
        let action = destroy(s, &second.id)?;
        ensure!(
            action == TerminationAction::Deleted,
            "destroy of an active lease said {}",
            action_text(action)
        );
        expect_refused(s, &second.id, "a destroyed lease")?;
        Ok(Verdict::passed())
    })
}

/// A reusable lease: release pauses it, a command is refused until resume,
/// resume gives it back with its files, destroy deletes it.
pub fn reuse(target: &Target) -> Result<Verdict> {
    let Some(patch) = target.reuse_patch() else {
        return Ok(Verdict::NotApplicable(
            "the target names no config that makes leases reusable".into(),
        ));
    };
    with_session(target, Some(patch), |s| {
        if !s
            .runtime()
            .description()
            .capabilities
            .contains(Capabilities::REUSABLE_LEASES)
        {
            return Ok(Verdict::NotApplicable(
                "the provider does not declare reusable-leases".into(),
            ));
        }
        let lease = s.acquire()?;
        let id = &lease.id;
        let workspace = match s.runtime().realize_workspace(
            s.env(),
            id,
            &WorkspaceRequest { remote_path: None },
        )? {
            Ok(path) => path,
            Err(error) => bail!("realize-workspace failed: {}", error_text(&error)),
        };
        let marker = unique_marker();
        let file = format!("{}/kit-reuse-file", workspace.trim_end_matches('/'));
        succeeded(
            "writing a file in the workspace",
            s.execute(
                id,
                &bash(&format!("echo {marker} > '{file}'")),
                None,
                Default::default(),
            )?,
        )?;

        let receipt = match s.runtime().release(s.env(), id)? {
            Ok(receipt) => receipt,
            Err(error) => bail!("release of a reusable lease failed: {}", error_text(&error)),
        };
        ensure!(
            receipt.action == TerminationAction::Paused,
            "release of a reusable lease must pause it, it said {}",
            action_text(receipt.action)
        );
        let state = s.state(id)?;
        ensure!(
            state == LeaseState::Released,
            "after release the lease is {state}"
        );
        expect_refused(s, id, "a released (paused) lease")?;

        match s.runtime().resume(s.env(), id)? {
            Ok(ResumeOutcome::Resumed(_)) => {}
            Ok(ResumeOutcome::Expired(reason)) => {
                bail!("resume of a paused lease said expired: {reason}")
            }
            Err(error) => bail!("resume failed: {}", error_text(&error)),
        }
        let state = s.state(id)?;
        ensure!(
            state == LeaseState::Active,
            "after resume the lease is {state}"
        );
        let out = succeeded(
            "reading the file after resume",
            s.execute(id, &cmd("cat", &[&file]), None, Default::default())?,
        )?;
        ensure!(
            out.stdout == format!("{marker}\n"),
            "the workspace file after resume: {:?}",
            out.stdout
        );

        let action = destroy(s, id)?;
        ensure!(
            action == TerminationAction::Deleted,
            "destroy of a resumed lease said {}",
            action_text(action)
        );
        Ok(Verdict::passed())
    })
}
