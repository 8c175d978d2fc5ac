/**
 * Every translation between the component's WIT types and Paperclip's
 * plugin shapes, in one place: contexts, leases, receipts, results, and
 * each `provider-error` case as the error Paperclip's host sees.
 *
 * Rules this module keeps:
 * - A receipt becomes Paperclip's lease status word: `paused` ->
 *   `stopped`, `deleted` and `already-gone` -> `destroyed` (each is a
 *   confirmed end). `idle-pause` (the sandbox left running until the
 *   service pauses it once idle, contract 0.7.0) is no receipt at all:
 *   Paperclip reads a receipt as "execution has ended" and grants the run
 *   continuation on it, while what the run's commands left in the
 *   background still runs until the pause. The release returns nothing,
 *   which Paperclip supports and which grants no such authority.
 * - A resume that the component reports `expired` becomes
 *   `{providerLeaseId: null, metadata: {expired: true}}`.
 * - `cleanup-failed` during acquire with a sandbox id carries that id
 *   (message and `data.providerLeaseId`) so Paperclip's own cleanup can run.
 * - Messages are for people: what happened, what may still run, what fixes
 *   it. They never hold the key (every message passes through `redact`) nor
 *   a provider response body (the component never reports one).
 */
import { PLUGIN_RPC_ERROR_CODES } from "@paperclipai/plugin-sdk/protocol";
import type {
  WitCleanupCause,
  WitCleanupFailure,
  WitEnvironmentContext,
  WitExecuteRequest,
  WitExecuteResult,
  WitLease,
  WitOutputLoss,
  WitPartialOutput,
  WitProviderError,
  WitResumeOutcome,
  WitTerminationReceipt,
} from "./wit-types.js";

/** Where the component's own lease metadata lives inside Paperclip's lease metadata. */
export const COMPONENT_LEASE_KEY = "componentLease";

/**
 * The working directory a lease asks its provider for when Paperclip names
 * none (it never does today), relative to the provider's workspace root
 * (CreateOS `/paperclip-workspace/workspace`, Daytona
 * `~/paperclip-workspace/workspace`), and reported to Paperclip as
 * `remoteCwd`. Paperclip runs the agent there and, before it syncs the
 * workspace in, removes every top-level entry of it but its own
 * (`.paperclip-runtime`, `.paperclip-upload-*`); without `remoteCwd` it
 * would use `/tmp`, where the providers stage a command's stdin. A
 * directory of its own holds nothing of the provider's: CreateOS keeps its
 * lease marker (the proof a resumed lease is the same sandbox) at the
 * workspace root, one level up.
 */
export const AGENT_WORKDIR = "workspace";

/** Paperclip's lease shape (`PluginEnvironmentLease`). */
export interface PaperclipLease {
  providerLeaseId: string | null;
  metadata?: Record<string, unknown>;
  expiresAt?: string | null;
}

/** Paperclip's termination receipt (`PluginEnvironmentTerminationReceipt`). */
export interface PaperclipReceipt {
  providerLeaseId: string;
  state: "stopped" | "destroyed";
}

/** Paperclip's execute result (`PluginEnvironmentExecuteResult`). */
export interface PaperclipExecuteResult {
  exitCode: number | null;
  signal: string | null;
  timedOut: boolean;
  stdout: string;
  stderr: string;
  metadata: Record<string, unknown>;
}

/** What the plugin must do about a failed call besides reporting it. */
export type ErrorConsequence = "none" | "poison-lease";

/** A provider error as Paperclip's host receives it (a JSON-RPC error). */
export class ProviderFailure extends Error {
  /** JSON-RPC error code (Paperclip's `WORKER_ERROR`). */
  readonly code: number = PLUGIN_RPC_ERROR_CODES.WORKER_ERROR;
  constructor(
    message: string,
    /** The WIT case, for people and logs (never branched on by Paperclip). */
    readonly kind: WitProviderError["tag"] | "trap" | "poisoned" | "foreign-company",
    readonly consequence: ErrorConsequence,
    /** Structured data (`providerLeaseId` of a sandbox that needs cleanup). */
    readonly data?: {
      providerLeaseId?: string;
      processId?: string;
      /** `output-lost`: what was lost, whether the tree is confirmed gone, and the output received before the loss. */
      outputLost?: { lostBytes: number | null; lostChunks: number | null; treeDeleted: boolean; stdout: string; stderr: string };
    },
  ) {
    super(message);
    this.name = "ProviderFailure";
  }
}

/** Replaces every occurrence of each secret with `[redacted]`. */
export function redact(text: string, secrets: readonly string[]): string {
  let out = text;
  for (const secret of secrets) if (secret.length > 0) out = out.split(secret).join("[redacted]");
  return out;
}

/** Paperclip's base params -> the WIT `environment-context`. */
export function toContext(
  params: { driverKey: string; companyId: string; environmentId: string; issueId?: string | null },
  componentConfig: string,
): WitEnvironmentContext {
  return {
    driverKey: params.driverKey,
    companyId: params.companyId,
    environmentId: params.environmentId,
    issueId: params.issueId ?? undefined,
    config: componentConfig,
  };
}

/** The component's lease -> Paperclip's lease, bound to the company. */
export function toPaperclipLease(lease: WitLease, companyId: string): PaperclipLease {
  let parsed: Record<string, unknown> = {};
  try {
    parsed = JSON.parse(lease.metadata) as Record<string, unknown>;
  } catch {
    // The component always writes JSON; an unreadable value is kept verbatim below.
  }
  return {
    providerLeaseId: lease.providerLeaseId,
    metadata: {
      provider: parsed.provider,
      companyId,
      environmentId: parsed.environmentId,
      apiOrigin: parsed.apiOrigin,
      cwd: parsed.cwd,
      // Where Paperclip runs the agent and syncs the workspace (AGENT_WORKDIR).
      remoteCwd: typeof parsed.cwd === "string" ? parsed.cwd : undefined,
      shape: parsed.shape,
      rootfs: parsed.rootfs ?? null,
      region: parsed.region ?? null,
      reusable: parsed.reusable,
      [COMPONENT_LEASE_KEY]: lease.metadata,
    },
    expiresAt: lease.expiresAt ?? null,
  };
}

/**
 * Paperclip's lease (or `providerLeaseId` + `leaseMetadata`) -> the WIT lease.
 * Metadata that holds no component lease (for example the id Paperclip keeps
 * after an acquire whose cleanup failed) becomes `{}`: the component then
 * destroys by id alone, and refuses everything else as foreign.
 */
export function toWitLease(providerLeaseId: string, metadata: Record<string, unknown> | null | undefined): WitLease {
  const stored = metadata?.[COMPONENT_LEASE_KEY];
  const expiresAt = typeof metadata?.expiresAt === "string" ? metadata.expiresAt : undefined;
  return { providerLeaseId, metadata: typeof stored === "string" ? stored : "{}", expiresAt };
}

/** The company a Paperclip lease was acquired for, if it records one. */
export function leaseCompany(metadata: Record<string, unknown> | null | undefined): string | undefined {
  const company = metadata?.companyId;
  return typeof company === "string" ? company : undefined;
}

/** `resume-outcome` -> Paperclip's lease (`providerLeaseId: null` when expired). */
export function toResumeResult(outcome: WitResumeOutcome, companyId: string): PaperclipLease {
  if (outcome.tag === "resumed") return toPaperclipLease(outcome.val, companyId);
  return { providerLeaseId: null, metadata: { expired: true, reason: outcome.val } };
}

/**
 * `termination-receipt` -> Paperclip's receipt, or none for an idle pause:
 * its sandbox may still run what the commands left in the background, and
 * Paperclip's receipt says that execution has ended.
 */
export function toReceipt(receipt: WitTerminationReceipt): PaperclipReceipt | undefined {
  if (receipt.action === "idle-pause") return undefined;
  const state = receipt.action === "paused" ? "stopped" : "destroyed";
  return { providerLeaseId: receipt.sandboxId, state };
}

/** Paperclip's execute params -> the WIT `execute-request`. */
export function toExecuteRequest(params: {
  command: string;
  args?: string[];
  cwd?: string;
  env?: Record<string, string>;
  stdin?: string;
  timeoutMs?: number;
}): WitExecuteRequest {
  const timeout = params.timeoutMs;
  return {
    command: params.command,
    args: params.args ?? [],
    cwd: params.cwd,
    env: Object.entries(params.env ?? {}),
    stdin: params.stdin === undefined ? undefined : new TextEncoder().encode(params.stdin),
    timeoutMs: typeof timeout === "number" && Number.isSafeInteger(timeout) && timeout > 0 ? BigInt(timeout) : undefined,
    // Unset: the provider's default (4 Mi characters of each stream), since
    // Paperclip's execute result carries the output's text besides the log.
    resultChars: undefined,
  };
}

/** `execute-result` -> Paperclip's execute result. */
export function toExecuteResult(result: WitExecuteResult): PaperclipExecuteResult {
  return {
    exitCode: result.exitCode ?? null,
    signal: result.signal ?? null,
    timedOut: result.timedOut,
    stdout: result.stdout,
    stderr: result.stderr,
    metadata: { processId: result.processId, outputTruncated: result.outputTruncated },
  };
}

function describeCause(cause: WitCleanupCause): string {
  switch (cause.tag) {
    case "http-status":
      return `the API answered HTTP ${cause.val}`;
    case "transport":
      return `the request failed in transport (${cause.val})`;
    case "deadline":
      return "the request did not finish before its deadline";
    case "tree-still-running":
      return "the API did not confirm that the process tree exited";
    case "invalid-response":
      return `the API answered something invalid (${cause.val})`;
  }
}

const PHASE_TEXT: Record<WitCleanupFailure["phase"], string> = {
  "process-creation": "creating the process could not be confirmed",
  "process-termination": "terminating the process tree could not be confirmed",
  "lease-setup": "setup failed and cleanup is unconfirmed",
  "sandbox-deletion": "deleting the sandbox could not be confirmed",
};

/**
 * What a failed command printed before the failure, in words: the output
 * itself already reached Paperclip live (`ctx.execution.log`).
 */
function partialText(partial: WitPartialOutput | undefined): string {
  if (!partial) return "";
  const timedOut = partial.timedOut ? " It had reached its timeout." : "";
  const truncated = partial.outputTruncated ? " Older output was dropped to respect the output cap." : "";
  return ` The command printed ${partial.stdout.length} characters of stdout and ${partial.stderr.length} of stderr before this (already sent live).${timedOut}${truncated}`;
}

/** The `output-loss.operation` of output the host's live sink did not consume (as in the Rust host). */
export const OUTPUT_SINK = "output-sink";

/**
 * A command's result whose live output the sink did not all take, as the
 * `output-lost` it is: the provider confirmed the command ended (its tree
 * is gone), and the result's output is kept.
 */
export function unconsumedOutput(result: WitExecuteResult, bytes: number): WitProviderError {
  return {
    tag: "output-lost",
    val: {
      operation: OUTPUT_SINK,
      processId: result.processId,
      lostBytes: BigInt(bytes),
      lostChunks: undefined,
      treeDeleted: true,
      partial: { stdout: result.stdout, stderr: result.stderr, timedOut: result.timedOut, outputTruncated: result.outputTruncated },
    },
  };
}

/**
 * A command cancelled because the sink failed (it threw or rejected), as
 * the `output-lost` it is: `cancelled` comes only after the component
 * confirmed the command's tree gone, and its partial output is kept.
 */
export function sinkFailedOutput(partial: WitPartialOutput | undefined, bytes: number): WitProviderError {
  return {
    tag: "output-lost",
    val: {
      operation: OUTPUT_SINK,
      processId: undefined,
      lostBytes: BigInt(bytes),
      lostChunks: undefined,
      treeDeleted: true,
      partial: partial ?? { stdout: "", stderr: "", timedOut: false, outputTruncated: false },
    },
  };
}

/**
 * An `output-loss` in words: how much the server dropped, that what arrived
 * before is kept (and already sent live), and whether the command may
 * still run.
 */
function lossText(loss: WitOutputLoss, provider: string, sinkFailure?: string): string {
  if (loss.operation === OUTPUT_SINK && sinkFailure !== undefined) {
    return `${loss.lostBytes ?? "Some"} bytes of the command's output were not consumed: the execution log (ctx.execution.log) failed (${sinkFailure}), so the command was stopped at once and the live log is incomplete; all of its processes are confirmed gone.`;
  }
  if (loss.operation === OUTPUT_SINK) {
    const ended = loss.partial.timedOut ? "the command's timeout ended it" : "the command had ended";
    return `${loss.lostBytes ?? "Some"} bytes of the command's output were not consumed: the execution log (ctx.execution.log) stopped taking output and ${ended}, so the live log is incomplete (the result keeps the last 4 Mi characters of each stream); ${loss.processId ? `process ${loss.processId}` : "the command"} was stopped and all of its processes are confirmed gone.`;
  }
  const amount =
    loss.lostBytes !== undefined
      ? `${loss.lostBytes} bytes of the command's output`
      : loss.lostChunks !== undefined
        ? `${loss.lostChunks} chunks of the command's output`
        : "part of the command's output (the server did not say how much)";
  const process = loss.processId ? `process ${loss.processId}` : "the command";
  const after = loss.treeDeleted
    ? `${process} was stopped and all of its processes are confirmed gone.`
    : `stopping ${process} was not confirmed, so part of it may still run. The lease is poisoned: it is refused for execute, resume and release until it is destroyed (environmentDestroyLease).`;
  return `${provider} dropped ${amount} before it was read (${loss.operation} found the loss), so the output is incomplete; what arrived before the loss is kept; ${after}`;
}

/** Which Paperclip operation a provider error came from. */
export type Operation =
  | "validate"
  | "probe"
  | "acquire"
  | "resume"
  | "release"
  | "destroy"
  | "realize"
  | "execute"
  | "sync-in"
  | "sync-out"
  | "login-pty"
  | "duplex-channel"
  | "open-port"
  | "set-egress"
  | "capture-template"
  | "list-templates"
  | "delete-template";

/** One `provider-error` -> the error Paperclip's host receives. */
export function toFailure(
  error: WitProviderError,
  operation: Operation,
  secrets: readonly string[] = [],
  /** The provider's `display-name` (`describe()`), for messages. */
  provider = "Provider",
  /** Why the execution log failed, for an `output-sink` loss it caused. */
  sinkFailure?: string,
): ProviderFailure {
  const clean = (text: string) => redact(text, secrets);
  switch (error.tag) {
    case "invalid-config":
      return new ProviderFailure(clean(`The ${provider} config is invalid: ${error.val.join("; ")}`), error.tag, "none");
    case "invalid-request":
      return new ProviderFailure(clean(`The ${operation} request was refused before any API call: ${error.val}`), error.tag, "none");
    case "foreign-lease":
      return new ProviderFailure(
        clean(`The lease does not belong to this environment (${error.val}); nothing was sent to ${provider}.`),
        error.tag,
        "none",
      );
    case "unsupported":
      return new ProviderFailure(clean(`${provider} cannot do this: ${error.val}`), error.tag, "none");
    case "api-rejected":
      return new ProviderFailure(
        clean(
          `${provider} rejected ${error.val.operation} with HTTP ${error.val.status}; nothing is left running.${partialText(error.val.partial)}`,
        ),
        error.tag,
        "none",
      );
    case "transport-failed": {
      const kind = error.val.kind;
      const how =
        kind === "denied"
          ? "the host refused the request (only the configured API origin is allowed), so it never left this machine"
          : kind === "unreachable"
            ? `the server could not be reached (${error.val.detail}), so the request never got there`
            : kind === "deadline"
              ? "its deadline passed"
              : `${kind} failure: ${error.val.detail}`;
      // `denied` and `unreachable`: the request was never sent, so nothing
      // was created by it; for the other kinds the component has already
      // confirmed that nothing it started is left running.
      const outcome = kind === "denied" || kind === "unreachable" ? "nothing was created" : "nothing is left running";
      return new ProviderFailure(
        clean(`${provider} ${error.val.operation} got no answer: ${how}; ${outcome}.${partialText(error.val.partial)}`),
        error.tag,
        "none",
      );
    }
    case "invalid-response":
      return new ProviderFailure(
        clean(
          `${provider} answered ${error.val.operation} with something invalid: ${error.val.reason}.${partialText(error.val.partial)}`,
        ),
        error.tag,
        "none",
      );
    case "cancelled":
      return new ProviderFailure(
        `The ${operation} was cancelled; its cleanup completed.${partialText(error.val)}`,
        error.tag,
        "none",
      );
    case "cleanup-failed": {
      const failure = error.val;
      const sandbox = failure.sandboxId ? `sandbox ${failure.sandboxId}` : "a sandbox whose id is unknown";
      const process = failure.processId ? `, process ${failure.processId}` : "";
      const partial = partialText(failure.partial);
      if (operation === "acquire") {
        const message = failure.sandboxId
          ? `${provider} setup failed and cleanup is unconfirmed for sandbox ${failure.sandboxId}: ${describeCause(failure.cause)}. Destroy that sandbox (environmentDestroyLease with providerLeaseId ${failure.sandboxId}).`
          : `${provider} setup failed and cleanup is unconfirmed: ${describeCause(failure.cause)}; the sandbox id is unknown, check the ${provider} account for a leftover sandbox.`;
        return new ProviderFailure(clean(message), error.tag, "none", {
          providerLeaseId: failure.sandboxId,
          processId: failure.processId,
        });
      }
      return new ProviderFailure(
        clean(
          `Cleanup is unconfirmed for ${sandbox}${process}: ${PHASE_TEXT[failure.phase]} (${describeCause(failure.cause)}); something may still run. The lease is poisoned: it is refused for execute, resume and release until it is destroyed (environmentDestroyLease).${partial}`,
        ),
        error.tag,
        "poison-lease",
        { providerLeaseId: failure.sandboxId, processId: failure.processId },
      );
    }
    case "output-lost": {
      const loss = error.val;
      return new ProviderFailure(
        clean(`${lossText(loss, provider, sinkFailure)}${partialText(loss.partial)}`),
        error.tag,
        loss.treeDeleted ? "none" : "poison-lease",
        {
          processId: loss.processId,
          outputLost: {
            lostBytes: loss.lostBytes === undefined ? null : Number(loss.lostBytes),
            lostChunks: loss.lostChunks === undefined ? null : Number(loss.lostChunks),
            treeDeleted: loss.treeDeleted,
            stdout: loss.partial.stdout,
            stderr: loss.partial.stderr,
          },
        },
      );
    }
  }
}
