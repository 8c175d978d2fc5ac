/**
 * The interactive features a package offers Paperclip: what its component
 * claims (`login-pty`, `duplex-channels`), less what a Paperclip agent run
 * does not yet survive on that driver. The manifest's declarations and the
 * worker's hooks both come from here, so they never disagree.
 *
 * Held back: Daytona's duplex channel. It carries bytes exactly (the
 * conformance kit, the CLI), but Daytona's ends are seen by polling its
 * session log, so at the end of an agent run the channel's exit can reach
 * Paperclip before the run command's result does; Paperclip counts that as
 * a control channel lost mid-run and fails the run (the e2e's Daytona run,
 * stop 19). Until that ordering is fixed its runs call back through
 * Paperclip's file bridge, as before issue 38.
 */
import type { WitProviderDescription } from "./wit-types.js";

/** Drivers whose duplex channel Paperclip is not offered, each with why. */
export const DUPLEX_HELD_BACK: Readonly<Record<string, string>> = {
  daytona:
    "its channel's exit is seen through the session log's polling and can reach Paperclip before the run command's result, which Paperclip counts as a lost control channel",
};

/** What the package of `description` offers Paperclip. */
export function offeredToPaperclip(description: Pick<WitProviderDescription, "driverKey" | "capabilities"> | undefined): { loginPty: boolean; duplexChannels: boolean } {
  const claims = description?.capabilities ?? {};
  return {
    loginPty: claims.loginPty ?? false,
    duplexChannels: (claims.duplexChannels ?? false) && !(description!.driverKey in DUPLEX_HELD_BACK),
  };
}
