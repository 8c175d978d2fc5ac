/**
 * The interactive features a package offers Paperclip: what its component
 * claims (`login-pty`, `duplex-channels`), less what its packer holds back
 * for that driver (`scripts/packer.mjs`, `HELD_BACK`, with the reason:
 * a feature the component carries but a Paperclip agent run does not yet
 * survive). The manifest declares exactly this. Host code names no
 * provider: what is held back comes from the packer.
 */
import type { WitProviderDescription } from "./wit-types.js";

/** Features a packer holds back from Paperclip, each with why. */
export interface HeldBack {
  duplexChannels?: string;
  loginPty?: string;
  runnerIngress?: string;
  templates?: string;
}

/** What the package of `description` offers Paperclip. */
export function offeredToPaperclip(
  description: Pick<WitProviderDescription, "capabilities"> | undefined,
  heldBack: HeldBack = {},
): { loginPty: boolean; duplexChannels: boolean; runnerIngress: boolean; templates: boolean } {
  const claims = description?.capabilities ?? {};
  return {
    loginPty: (claims.loginPty ?? false) && heldBack.loginPty === undefined,
    duplexChannels: (claims.duplexChannels ?? false) && heldBack.duplexChannels === undefined,
    // The runner's WebSocket ingress is an opened port (`ports`).
    runnerIngress: (claims.ports ?? false) && heldBack.runnerIngress === undefined,
    // Interactive setup and template capture are templates (`setup-sessions.ts`).
    templates: (claims.templates ?? false) && heldBack.templates === undefined,
  };
}
